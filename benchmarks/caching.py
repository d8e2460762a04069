"""How much of each request repeats the previous one byte for byte (docs/cost.md#prompt-caching).

A provider's prompt cache serves the longest prefix a request shares with an earlier one,
so every byte that changes early in a request is paid again from there on. This runs one
scripted 20-iteration turn (a tool call with a ~1.5 KB output per iteration, then the
answer) through the real loop (`core.loop.run_loop`), the real context manager (a window
small enough that old tool outputs get masked mid-turn) and each real wire format, against
the in-process fake LLM, and measures, for every request after the first, the fraction of
its bytes that repeat the previous request's prefix byte for byte.

Requests right after a rewrite of history (masking, compaction) are counted apart: that is
where the prefix is meant to break. "Masking per call" is the old behaviour (`mask_batch =
1`: every call masks the output that just aged out, rewriting history each time) for
comparison. Usage (from the repo root)::

    .venv/bin/python benchmarks/caching.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, Field  # noqa: E402

from core.context.manager import ContextManager, ContextSettings  # noqa: E402
from core.context.tokens import TokenCounter  # noqa: E402
from core.events import LoopEvent, Observed  # noqa: E402
from core.loop import Guards, LoopConfig, run_loop  # noqa: E402
from core.messages import TURN_MARK, Message  # noqa: E402
from core.providers import ProviderSettings, build_provider  # noqa: E402
from core.providers.base import CACHE_SCOPE  # noqa: E402
from core.run_context import RunContext  # noqa: E402
from core.tools.base import Tool, ToolContext, ToolRegistry, ToolResult  # noqa: E402
from core.tools.executor import ToolExecutor  # noqa: E402
from core.tools.policy import ToolPolicy  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec  # noqa: E402

MARK = b',"cache_control":{"type":"ephemeral"}'
OUTPUT_LINES: ContextVar[int] = ContextVar("output_lines", default=30)  # ~50 B a line
SIZES = {"0.5 KB": 10, "1.5 KB": 30, "4 KB": 80}  # tool output per iteration
ITERATIONS = 20
WINDOW = 12_000  # tokens: old outputs are masked from about the 10th iteration on
EXTRA_TOOLS = 16  # a request carries about as many tools as Parley's built-ins
KINDS = ("openai_chat", "openai_responses", "anthropic")
SYSTEM = (
    (
        "You are Parley, a helpful assistant for a software team. Use tools when they help; "
        "be concise. Tools run in the working directory /srv/workspace."
    )
    * 3
    + TURN_MARK
    + "Today is 2026-11-26 (UTC)."
)


class ReadArgs(BaseModel):
    path: str = Field(description="The log file to read")


class ReadLog(Tool):
    name: str = "read_log"
    description: str = "Read one log file."
    category = "read"
    params = ReadArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, ReadArgs)
        lines = [
            f"{args.path}:{n} worker-{n % 7} handled request {n * 37} in {n % 13} ms"
            for n in range(OUTPUT_LINES.get())
        ]
        return ToolResult("\n".join(lines))


class OtherArgs(BaseModel):
    path: str = Field(description="A path inside the workspace, relative to its root")
    pattern: str = Field("", description="A regular expression the lines must match, if any")
    limit: int = Field(200, description="At most this many lines or entries in the answer")


def other_tool(n: int) -> Tool:
    """A stand-in for a built-in tool: its name, description and schema take room."""

    class Other(Tool):
        name: str = f"tool_{n}"
        description: str = (
            f"Tool number {n}: inspects files of the workspace and reports what it finds, "
            "with line numbers, sizes and modification times; read-only, safe to call "
            "again; large answers are cut to the limit and say where they were cut."
        )
        category = "read"
        params = OtherArgs

        async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
            return ToolResult("")

    return Other()


def script(rec: RecordedRequest) -> Reply:
    """A tool call per iteration, by how many results the request holds; then the answer."""
    body = rec.json
    items = body.get("messages") or body.get("input") or []
    done = sum(
        1
        for m in items
        if m.get("role") == "tool"
        or m.get("type") == "function_call_output"
        or any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in m.get("content") or []
        )
    )
    if done < ITERATIONS - 1:
        return Reply(tool_calls=[ToolCallSpec("read_log", {"path": f"/var/log/app-{done}.log"})])
    return Reply(text="The logs show nothing unusual.")


@dataclass
class Measured:
    """(bytes repeated, request bytes) per request after the first: in steady requests,
    and in those right after masking or compaction rewrote history."""

    steady: list[tuple[int, int, int]] = field(default_factory=list)
    rewrites: list[tuple[int, int, int]] = field(default_factory=list)

    @staticmethod
    def share(pairs: list[tuple[int, int, int]], of: int = 1) -> str:
        """Of all these requests' bytes (`of` 2: of the previous requests' bytes), the
        fraction that repeats."""
        total = sum(p[of] for p in pairs)
        return f"{sum(p[0] for p in pairs) / total:.1%}" if total else "–"


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    step = 4096
    while i < n and a[i : i + step] == b[i : i + step]:
        i += step
    i = min(i, n)
    while i > 0 and a[:i] != b[:i]:
        i -= 1
    while i < n and a[i] == b[i]:
        i += 1
    return i


async def one_turn(kind: str, mask_batch: int, window: int = WINDOW) -> Measured:
    fake = FakeLLM(api_key="k")
    await fake.start()
    try:
        fake.responder = script
        base = fake.root_url if kind == "anthropic" else fake.base_url
        provider = build_provider(
            ProviderSettings("bench", kind, base, "fake-model", api_key="k", context_window=window)
        )
        tools = [ReadLog(), *(other_tool(n) for n in range(EXTRA_TOOLS))]
        executor = ToolExecutor(ToolRegistry(tools), ToolPolicy(), ToolContext())
        counter = TokenCounter()
        settings = ContextSettings(mask_batch=mask_batch)
        context = ContextManager(window, counter, None, settings)
        rewritten_before: set[int] = set()

        def sink(event: LoopEvent) -> None:
            if isinstance(event, Observed) and event.name == "agent.compaction.run":
                rewritten_before.add(len(fake.requests))  # the next request follows it

        messages = [Message.system(SYSTEM), Message.user("Check the logs of every worker.")]
        token = CACHE_SCOPE.set("bench:conv")
        try:
            config = LoopConfig(max_iterations=ITERATIONS + 2)
            outcome = await run_loop(
                messages,
                provider,
                executor,
                RunContext(conv="bench:conv", sink=sink),
                config=config,
                counter=counter,
                guards=Guards(context=context),
            )
        finally:
            CACHE_SCOPE.reset(token)
            await provider.aclose()
        assert outcome.reason == "final", outcome
        assert all(r.error is None for r in fake.requests), [r.error for r in fake.requests]
        measured = Measured()
        # Anthropic's breakpoints move on to the newest messages with every call; the
        # cache does not key on them, so their bytes are left out of the comparison.
        raws = [r.raw.replace(MARK, b"") for r in fake.requests]
        for i in range(1, len(raws)):
            pair = (common_prefix(raws[i - 1], raws[i]), len(raws[i]), len(raws[i - 1]))
            (measured.rewrites if i in rewritten_before else measured.steady).append(pair)
        return measured
    finally:
        await fake.stop()


async def main(quick: bool) -> None:
    rows = []
    for kind in KINDS:
        batched = await one_turn(kind, ContextSettings().mask_batch)
        per_call = await one_turn(kind, 1)
        rows.append((kind, batched, per_call))
    print(
        f"Request bytes repeating the previous request's prefix, one {ITERATIONS}-iteration "
        "turn (each request's new messages can never repeat)"
    )
    print()
    print(
        "| wire format | of request bytes, outside rewrites | of the previous request, "
        "outside rewrites | all requests | rewrites | before (masking per call): all "
        "requests | rewrites |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, batched, per_call in rows:
        every = batched.steady + batched.rewrites
        before = per_call.steady + per_call.rewrites
        print(
            f"| {kind} | {batched.share(batched.steady)} | {batched.share(batched.steady, 2)} "
            f"| {batched.share(every)} | {len(batched.rewrites)} | {per_call.share(before)} | "
            f"{len(per_call.rewrites)} |"
        )
    print()
    print("By the size of each iteration's tool output (openai_chat, masking in batches):")
    print()
    print("| tool output | of request bytes, outside rewrites | of the previous request |")
    print("|---|---|---|")
    for label, lines in SIZES.items():
        token = OUTPUT_LINES.set(lines)
        try:
            # the window grows with the outputs: masking starts about as far into the turn
            window = WINDOW * max(lines, 30) // 30
            sized = await one_turn("openai_chat", ContextSettings().mask_batch, window)
        finally:
            OUTPUT_LINES.reset(token)
        print(f"| {label} | {sized.share(sized.steady)} | {sized.share(sized.steady, 2)} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same run (it is quick)")
    asyncio.run(main(parser.parse_args().quick))
