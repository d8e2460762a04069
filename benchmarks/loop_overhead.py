"""Per-iteration overhead of Parley's tool loop versus a minimal raw-httpx loop.

Both sides talk to the same in-process fake LLM (``tests.fakes.llm.FakeLLM``, OpenAI Chat
Completions wire format, zero latency). One user turn makes K tool iterations: the fake answers
the first K requests of the turn with one call to a trivial read tool, then a final text answer.

* **Parley**: ``core.loop.run_loop`` with a real ``openai_chat`` provider (httpx2 with its SSE +
  fragment merging + pydantic messages) and a ``ToolExecutor`` running ``LookupTool``.
* **Baseline**: the most direct equivalent: one shared ``httpx.AsyncClient``, ``aiter_lines()``,
  ``json.loads`` of ``data:`` lines, fragments concatenated by index, a list of dicts as history,
  and the same ``lookup()`` function as the tool's work. It sends byte-identical request bodies
  and headers. It reads each response to its end (past ``data: [DONE]``), so its keep-alive
  connection goes back to the pool; a client that stops reading at ``[DONE]`` leaves the body
  unfinished and httpcore closes the connection. The output says how many connections each side
  opened in one turn.

Runs are interleaved (A, B, B, A, ...) after a warm-up; medians are reported.
Per-iteration overhead = (median turn time at K - median turn time at K=0) / K.

Usage (from the repo root)::

    .venv/bin/python benchmarks/loop_overhead.py [--quick] [--reps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import httpx2  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from core.loop import LoopConfig, run_loop  # noqa: E402
from core.messages import Message  # noqa: E402
from core.providers import Provider, ProviderSettings, build_provider  # noqa: E402
from core.tools.base import Tool, ToolContext, ToolRegistry, ToolResult  # noqa: E402
from core.tools.executor import ToolExecutor  # noqa: E402
from core.tools.policy import ToolPolicy  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec  # noqa: E402

KS = (0, 5, 20)
MODEL = "fake-model"
CHUNK_SIZE = 8  # characters per SSE fragment, as the fake's default
MAX_OUTPUT_TOKENS = 4096
TIMEOUT = httpx.Timeout(120.0, connect=10.0)  # what a Provider's own client uses

SYSTEM_PROMPT = (
    "You are Parley, a helpful assistant that lives in a team chat. Answer concisely. "
    "Use the tools you are given when they help; never invent tool results. "
) * 4
USER_TEXT = "Please look up the status of the items we discussed and summarise them for me."
FINAL_TEXT = (
    "All the items you asked about are in good shape: each one reports status ok, "
    "has an owner assigned and was updated recently. Nothing needs your attention today."
)


# ---------------------------------------------------------------------- the tool's work


def lookup(key: str) -> str:
    """The trivial tool body both sides run."""
    return f"{key}: status=ok owner=team-platform updated=2024-05-01 notes=nothing to report"


class LookupArgs(BaseModel):
    key: str = Field(description="The item to look up")


class LookupTool(Tool):
    name: str = "lookup"
    description: str = "Look up the status of an item."
    category = "read"
    params = LookupArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, LookupArgs)
        return ToolResult(lookup(args.key))


# ---------------------------------------------------------------------- the fake's script


class Script:
    """Responder: the first `k` requests of a turn get one tool call, then a final answer.

    The position in the turn is the number of tool results already in the request, so the
    script is the same whatever client sends it.
    """

    def __init__(self) -> None:
        self.k = 0

    def __call__(self, rec: RecordedRequest) -> Reply:
        done = sum(1 for m in rec.json["messages"] if m.get("role") == "tool")
        if done < self.k:
            call = ToolCallSpec(LookupTool.name, {"key": f"item-{done}"})
            return Reply(tool_calls=[call], chunk_size=CHUNK_SIZE)
        return Reply(text=FINAL_TEXT, chunk_size=CHUNK_SIZE)


# ---------------------------------------------------------------------- the two sides

Turn = Callable[[int], Awaitable[None]]


def parley_side(provider: Provider, executor: ToolExecutor) -> Turn:
    config = LoopConfig(max_iterations=max(KS) + 5)

    async def turn(k: int) -> None:
        messages = [Message.system(SYSTEM_PROMPT), Message.user(USER_TEXT)]
        outcome = await run_loop(messages, provider, executor, config=config)
        if outcome.reason != "final" or outcome.iterations != k + 1:
            raise AssertionError(f"parley: unexpected outcome {outcome}")

    return turn


def add_tool_round(
    messages: list[dict[str, Any]], content: str, calls: dict[int, list[str]]
) -> None:
    """Append the assistant's tool calls and each call's `lookup` result, as wire dicts."""
    wire_calls: list[dict[str, Any]] = [
        {
            "id": p[0],
            "type": "function",
            "function": {"name": p[1], "arguments": "".join(p[2:])},
        }
        for _, p in sorted(calls.items())
    ]
    messages.append({"role": "assistant", "content": content or None, "tool_calls": wire_calls})
    for call in wire_calls:
        args = json.loads(call["function"]["arguments"])
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": lookup(args["key"])}
        )


async def raw_call(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, dict[int, list[str]]]:
    """One streamed Chat Completions call, parsed the most direct way: the answer text and
    the tool calls by index as [id, name, argument fragments...]."""
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue  # read on to the end: the connection goes back to the pool
            chunk = json.loads(data)
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if content := delta.get("content"):
                    text.append(content)
                for frag in delta.get("tool_calls") or ():
                    parts = calls.setdefault(frag["index"], ["", ""])
                    if call_id := frag.get("id"):
                        parts[0] = call_id
                    function = frag.get("function") or {}
                    if name := function.get("name"):
                        parts[1] = name
                    if args := function.get("arguments"):
                        parts.append(args)
    return "".join(text), calls


def baseline_side(client: httpx.AsyncClient, base_url: str, tool: Tool) -> Turn:
    url = base_url + "/chat/completions"
    headers = {"Accept": "text/event-stream"}
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.schema(),
            },
        }
    ]

    async def turn(k: int) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_TEXT},
        ]
        for _ in range(max(KS) + 5):
            body = {
                "model": MODEL,
                "messages": messages,
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": MAX_OUTPUT_TOKENS,
                "tools": tools,
            }
            content, calls = await raw_call(client, url, body, headers)
            if not calls:
                messages.append({"role": "assistant", "content": content})
                if len(messages) != 3 + 2 * k:
                    raise AssertionError("baseline: unexpected number of iterations")
                return
            add_tool_round(messages, content, calls)
        raise AssertionError("baseline: too many iterations")

    return turn


# ---------------------------------------------------------------------- measurement


class ConnectionCounter:
    """Response hook (httpx or httpx2): counts responses that arrived on a new TCP connection."""

    def __init__(self) -> None:
        self.last: object = None
        self.opened = 0

    async def __call__(self, response: httpx.Response | httpx2.Response) -> None:
        stream = response.extensions.get("network_stream")
        if stream is not self.last:
            self.opened += 1
            self.last = stream  # kept alive, so a new connection is never the same object


async def count_connections(
    client: httpx.AsyncClient | httpx2.AsyncClient, turn: Turn, k: int
) -> int:
    """Connections opened by one turn of K iterations (untimed: hooks cost time)."""
    counter = ConnectionCounter()
    client.event_hooks = {"response": [counter]}
    try:
        await turn(k)
    finally:
        client.event_hooks = {}
    return counter.opened


async def measure(
    fake: FakeLLM, script: Script, turn: Turn, k: int, samples: dict[str, list[float]]
) -> None:
    script.k = k
    fake.requests.clear()  # the fake records every request; keep its memory flat
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await turn(k)
    wall1, cpu1 = time.perf_counter(), time.process_time()
    samples["wall"].append((wall1 - wall0) * 1000)
    samples["cpu"].append((cpu1 - cpu0) * 1000)


async def bench(reps: int, warmup: int, budget: float) -> dict[str, Any]:
    script = Script()
    tool = LookupTool()
    async with FakeLLM() as fake, httpx.AsyncClient(timeout=TIMEOUT) as client:
        fake.responder = script
        settings = ProviderSettings(
            "bench", "openai_chat", fake.base_url, MODEL, max_output_tokens=MAX_OUTPUT_TOKENS
        )
        provider = build_provider(settings)  # owns its client, as in production
        executor = ToolExecutor(ToolRegistry([tool]), ToolPolicy(), ToolContext())
        sides = {
            "parley": parley_side(provider, executor),
            "baseline": baseline_side(client, fake.base_url, tool),
        }
        samples: dict[str, dict[int, dict[str, list[float]]]] = {
            name: {k: {"wall": [], "cpu": []} for k in KS} for name in sides
        }
        try:
            for _ in range(warmup):
                for k in KS:
                    script.k = k
                    for turn in sides.values():
                        await turn(k)
            fake.requests.clear()
            started = time.perf_counter()
            done = 0
            for rep in range(reps):
                order = list(sides) if rep % 2 == 0 else list(reversed(sides))
                for k in KS:
                    for name in order:
                        await measure(fake, script, sides[name], k, samples[name][k])
                done += 1
                if time.perf_counter() - started > budget:
                    break
            script.k = max(KS)
            connections = {
                "parley": await count_connections(provider.client, sides["parley"], max(KS)),
                "baseline": await count_connections(client, sides["baseline"], max(KS)),
            }
            if fake.unexpected:
                raise AssertionError(f"fake LLM answered {fake.unexpected} unexpected requests")
        finally:
            await provider.aclose()
    return {"reps": done, "warmup": warmup, "samples": samples, "connections": connections}


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    samples = run["samples"]
    result: dict[str, Any] = {
        "reps": run["reps"],
        "warmup": run["warmup"],
        "ks": list(KS),
        "connections_per_turn": {"k": max(KS), **run["connections"]},
    }
    for name, by_k in samples.items():
        side: dict[str, Any] = {}
        for k in KS:
            row = {f"{m}_ms_per_turn": statistics.median(by_k[k][m]) for m in ("wall", "cpu")}
            for m in ("wall", "cpu"):
                row[f"{m}_ms_per_turn_min"] = min(by_k[k][m])
            side[str(k)] = row
        for k in KS:
            for m in ("wall", "cpu"):
                per_iter = None
                if k:
                    total = side[str(k)][f"{m}_ms_per_turn"] - side["0"][f"{m}_ms_per_turn"]
                    per_iter = total / k
                side[str(k)][f"{m}_ms_per_iteration"] = per_iter
        result[name] = side
    ratios: dict[str, dict[str, float | None]] = {}
    for k in KS:
        ratios[str(k)] = {}
        for m in ("wall", "cpu"):
            a = result["parley"][str(k)][f"{m}_ms_per_iteration"]
            b = result["baseline"][str(k)][f"{m}_ms_per_iteration"]
            ratios[str(k)][m] = a / b if a is not None and b else None
    result["ratio_per_iteration"] = ratios
    return result


def render(summary: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    def ratio(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}×"

    head = (
        "| K | Parley wall ms/turn | baseline wall ms/turn | Parley wall ms/iter "
        "| baseline wall ms/iter | ratio wall/iter | Parley CPU ms/turn | baseline CPU ms/turn "
        "| Parley CPU ms/iter | baseline CPU ms/iter | ratio CPU/iter |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k in KS:
        p, b = summary["parley"][str(k)], summary["baseline"][str(k)]
        r = summary["ratio_per_iteration"][str(k)]
        cells = [str(k)]
        for m in ("wall", "cpu"):
            cells += [
                ms(p[f"{m}_ms_per_turn"]),
                ms(b[f"{m}_ms_per_turn"]),
                ms(p[f"{m}_ms_per_iteration"]),
                ms(b[f"{m}_ms_per_iteration"]),
                ratio(r[m]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few repetitions (smoke test)")
    parser.add_argument("--reps", type=int, help="measured repetitions (default 200, quick 3)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the numbers here")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 200)
    warmup = 1 if args.quick else 5
    budget = 5.0 if args.quick else 45.0  # seconds of measuring; stops early past this

    summary = summarise(asyncio.run(bench(reps, warmup, budget)))
    ratio_k20 = summary["ratio_per_iteration"][str(max(KS))]["wall"]

    print(
        f"# Loop overhead: Parley run_loop vs raw httpx loop "
        f"({summary['reps']} interleaved reps after {warmup} warm-up, medians)\n"
    )
    print(
        "> Note: the fake LLM server runs in the same process and event loop, so its CPU "
        "time (aiohttp, request validation, SSE encoding) is counted in both columns equally; "
        "the ratios therefore understate the difference in client-side overhead.\n"
    )
    print(render(summary))
    print()
    shown = "n/a" if ratio_k20 is None else f"{ratio_k20:.2f}×"
    conns = summary["connections_per_turn"]
    print(
        f"TCP connections opened in one K={conns['k']} turn ({conns['k'] + 1} requests): "
        f"Parley {conns['parley']}, baseline {conns['baseline']}\n"
    )
    print(f"per-iteration overhead ratio (K={max(KS)}, wall): {shown} (goal ≤ 1.5×)")

    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
