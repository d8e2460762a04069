"""Many conversations at once: Parley's durable agent versus a raw-httpx loop, one process.

N conversations (default 200) each send one message at the same moment; every turn makes
five tool iterations (the fake LLM answers the first five requests of a turn with one call
to a trivial read tool, then a final text), so a turn is six LLM calls. The fake LLM
(``tests.fakes.llm.FakeLLM``, OpenAI Chat Completions wire format) runs by default in the
same process and event loop, at 0 ms and at 200 ms latency (its responder sleeps before the
first byte of every response). The script decides from the number of tool messages in each
request, so all conversations interleave freely.

* **Parley**: the real durable agent as a channel drives it: ``bot.app.App`` +
  ``app.open_agent()`` on a fresh SQLite store, one ``openai_chat`` provider at the fake, the
  built-in tools plus ``lookup`` (the trivial read tool of ``loop_overhead.py``), every
  message submitted with ``agent.submit(inbound, responder)`` (distinct conversation keys,
  platform event ids as real channels send them) and ``agent.wait_idle()``. Its latency
  ends when the reply stream is finished (after the run's final store flush). Loop
  detection is off: five calls of one tool would draw its nudge, an extra message.
* **raw httpx**: ``loop_overhead.py``'s baseline loop, N turns under ``asyncio.gather`` on
  one shared ``httpx.AsyncClient``. Its request bodies are built from the body Parley sent
  in its warm-up (same system prompt, same tool list, same key order), so both sides send
  the same bytes apart from the fake's call ids (checked on one turn of each before
  measuring); the tool's work is the same ``lookup()``.

Both sides use an ``httpx.AsyncClient`` with the same pool limits (max connections and
keep-alive connections = N unless ``--max-connections`` / ``--keepalive`` say otherwise;
Parley's provider is given that client, as ``Provider(settings, client)`` allows) and
``trust_env=False``. ``--fake-process`` runs the fake in a child process instead, so the CPU,
RSS and event loop measured are the clients' only.

Order: a small warm-up of both sides, then for each latency the raw loop, then Parley (each
Parley phase on a new App and store), ``--reps`` times; each figure is the median over the
repetitions (peak RSS: the highest). Turn latency is from a conversation's submission to its
final answer; throughput is N / wall time of the phase; CPU is ``time.process_time()`` (all
threads, so aiosqlite's too) over the phase / N; p99 is the nearest-rank percentile.

Store figures (Parley only) come from wrapping the store's group commit and its durable
``write()`` on the instance: commits and statements per turn, aiosqlite round trips per
commit, and "store wait": the time a turn spends awaiting durable writes (tool-call envelope,
the final flush).

Usage (from the repo root)::

    .venv/bin/python benchmarks/concurrency.py [--quick] [--conversations N] [--reps R]
        [--max-connections M] [--keepalive K] [--fake-process] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import multiprocessing
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import httpx2  # noqa: E402

from benchmarks.loop_overhead import (  # noqa: E402
    FINAL_TEXT,
    MAX_OUTPUT_TOKENS,
    MODEL,
    TIMEOUT,
    USER_TEXT,
    LookupTool,
    Script,
    add_tool_round,
    raw_call,
)
from bot.app import App, build_registry  # noqa: E402
from bot.config import parse_config  # noqa: E402
from core.agent import Agent  # noqa: E402
from core.chat import Inbound  # noqa: E402
from core.events import LoopEvent  # noqa: E402
from core.providers import build_provider  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply  # noqa: E402

ITERATIONS = 5  # tool iterations per turn
CALLS = ITERATIONS + 1  # LLM calls per turn
LATENCIES_MS = (0, 200)
PROVIDER = "fake"
SIDES = ("parley", "raw")
CALL_ID = re.compile(r"\bcall_\d+\b")  # the fake numbers its tool calls across both sides


# ---------------------------------------------------------------------- the fake's script


class Latent:
    """The fake's responder: `loop_overhead.Script` (five tool calls, then the final text),
    answered `latency` seconds late. Also counts requests and keeps the template body."""

    def __init__(self, fake: FakeLLM) -> None:
        self.fake = fake
        self.script = Script()
        self.script.k = ITERATIONS
        self.latency = 0.0
        self.served = 0
        self.template: dict[str, Any] | None = None  # the first request of a Parley turn
        self.recording: list[str] | None = None  # request bodies, call ids normalised

    def __call__(self, rec: RecordedRequest) -> Reply | Awaitable[Reply]:
        self.fake.requests.clear()  # the fake records every request; keep its memory flat
        self.served += 1
        if self.template is None and len(rec.json["messages"]) == 2:
            self.template = rec.json
        if self.recording is not None:
            self.recording.append(CALL_ID.sub("call_N", json.dumps(rec.json)))
        reply = self.script(rec)
        return self._late(reply) if self.latency else reply

    async def _late(self, reply: Reply) -> Reply:
        await asyncio.sleep(self.latency)  # before the response starts: a first-byte delay
        return reply


class Fake(Protocol):
    """The fake LLM as the benchmark drives it, in this process or in a child process."""

    base_url: str

    def set_latency(self, seconds: float) -> None: ...

    def counters(self) -> tuple[int, int, int]:
        """(requests served, TCP connections seen, unexpected requests) so far."""

    def template(self) -> dict[str, Any] | None: ...

    def record(self, on: bool) -> list[str]:
        """Start or stop recording request bodies; returns those recorded so far."""


class LocalFake:
    """The fake in this process and event loop: its CPU counts for both sides."""

    def __init__(self, fake: FakeLLM) -> None:
        self.fake, self.script = fake, Latent(fake)
        fake.responder = self.script
        self.base_url = fake.base_url

    def set_latency(self, seconds: float) -> None:
        self.script.latency = seconds

    def counters(self) -> tuple[int, int, int]:
        return self.script.served, self.fake.connections, self.fake.unexpected

    def template(self) -> dict[str, Any] | None:
        return self.script.template

    def record(self, on: bool) -> list[str]:
        recorded = self.script.recording or []
        self.script.recording = [] if on else None
        return recorded


class RemoteFake:
    """The fake in a child process (`--fake-process`), driven over a pipe between phases."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.base_url = str(self._receive())

    def _receive(self) -> Any:
        if not self.conn.poll(30):
            raise RuntimeError("the fake LLM process did not answer")
        return self.conn.recv()

    def _ask(self, command: str, arg: object = None) -> Any:
        self.conn.send((command, arg))
        return self._receive()

    def set_latency(self, seconds: float) -> None:
        self._ask("latency", seconds)

    def counters(self) -> tuple[int, int, int]:
        served, connections, unexpected = self._ask("counters")
        return served, connections, unexpected

    def template(self) -> dict[str, Any] | None:
        template: dict[str, Any] | None = self._ask("template")
        return template

    def record(self, on: bool) -> list[str]:
        recorded: list[str] = self._ask("record", on)
        return recorded


def serve_fake(conn: Connection) -> None:
    """The child process of `--fake-process`."""
    asyncio.run(_serve_fake(conn))


async def _serve_fake(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    async with FakeLLM() as fake:
        local = LocalFake(fake)
        conn.send(fake.base_url)
        while True:
            command, arg = await loop.run_in_executor(None, conn.recv)
            if command == "stop":
                conn.send(None)
                return
            if command == "latency":
                local.set_latency(arg)
                conn.send(None)
            elif command == "counters":
                conn.send(local.counters())
            elif command == "template":
                conn.send(local.template())
            elif command == "record":
                conn.send(local.record(arg))


@contextlib.asynccontextmanager
async def running_fake(in_process: bool) -> AsyncIterator[Fake]:
    if in_process:
        async with FakeLLM() as fake:
            yield LocalFake(fake)
        return
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve_fake, args=(child,), name="fake-llm", daemon=True)
    process.start()
    try:
        yield RemoteFake(parent)
    finally:
        with contextlib.suppress(OSError, EOFError):
            parent.send(("stop", None))
            parent.recv()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()


# ---------------------------------------------------------------------- measurement


def maxrss_mib() -> float:
    """The process's peak RSS so far (`ru_maxrss`: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


class RssSampler:
    """The highest current RSS seen during a phase (sampled every 50 ms; Linux only)."""

    INTERVAL = 0.05  # an event-loop wake-up costs CPU too; keep it rare

    def __init__(self) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self.start = self.current()
        self.peak = self.start

    def current(self) -> float | None:
        """Resident set size now, from the second field of /proc/self/statm (pages)."""
        if self._fd is None:
            return None
        pages = int(os.pread(self._fd, 256, 0).split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)

    def sample(self) -> None:
        now = self.current()
        if now is not None and self.peak is not None:
            self.peak = max(self.peak, now)

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.INTERVAL)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RssSampler]:
        task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def growth(self) -> float | None:
        return None if self.start is None or self.peak is None else self.peak - self.start


@dataclass
class Phase:
    """What one side did at one latency."""

    side: str
    latency_ms: int
    conversations: int
    wall_s: float = 0.0
    cpu_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    maxrss_before_mib: float = 0.0
    maxrss_after_mib: float = 0.0
    rss_growth_mib: float | None = None
    connections: int = 0
    commits: int | None = None
    statements: int | None = None
    round_trips: int | None = None
    commit_s: float | None = None  # inside the store's group commits
    store_wait_s: float | None = None  # awaiting durable writes, summed over all turns

    def summary(self) -> dict[str, Any]:
        n = self.conversations
        ordered = sorted(self.latencies_ms)
        out: dict[str, Any] = {
            "turns_per_s": n / self.wall_s,
            "p50_ms": statistics.median(ordered),
            "p99_ms": ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)],
            "max_ms": ordered[-1],
            "cpu_ms_per_turn": self.cpu_s * 1000 / n,
            "wall_s": self.wall_s,
            "maxrss_before_mib": self.maxrss_before_mib,
            "maxrss_after_mib": self.maxrss_after_mib,
            "maxrss_growth_mib": self.maxrss_after_mib - self.maxrss_before_mib,
            "rss_growth_mib": self.rss_growth_mib,
            "tcp_connections": self.connections,
            "commits_per_turn": None,
            "statements_per_turn": None,
            "round_trips_per_commit": None,
            "commit_ms": None,
            "store_wait_ms_per_turn": None,
        }
        if self.commits is not None and self.statements is not None:
            commits = max(1, self.commits)
            out["commits_per_turn"] = self.commits / n
            out["statements_per_turn"] = self.statements / n
            out["round_trips_per_commit"] = (self.round_trips or 0) / commits
            out["commit_ms"] = (self.commit_s or 0.0) * 1000 / commits
            out["store_wait_ms_per_turn"] = (self.store_wait_s or 0.0) * 1000 / n
        return out


@contextlib.asynccontextmanager
async def measuring(phase: Phase, fake: Fake) -> AsyncIterator[None]:
    gc.collect()
    phase.maxrss_before_mib = maxrss_mib()
    served0, connections0, _ = fake.counters()
    async with RssSampler().running() as sampler:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        yield
        phase.wall_s = time.perf_counter() - wall0
        phase.cpu_s = time.process_time() - cpu0
    phase.maxrss_after_mib = maxrss_mib()
    phase.rss_growth_mib = sampler.growth
    served, connections, _ = fake.counters()
    phase.connections = connections - connections0
    if served - served0 != phase.conversations * CALLS:
        raise AssertionError(f"{phase.side}: {served - served0} LLM calls")


# ---------------------------------------------------------------------- raw httpx


RawTurn = Callable[[], Awaitable[None]]


def raw_turn(client: httpx.AsyncClient, base_url: str, template: dict[str, Any]) -> RawTurn:
    """`loop_overhead.baseline_side`, sending Parley's own first request body as the start."""
    url = base_url + "/chat/completions"
    headers = {"Accept": "text/event-stream"}

    async def turn() -> None:
        messages: list[dict[str, Any]] = list(template["messages"])
        for _ in range(CALLS + 5):
            body = {**template, "messages": messages}  # same keys, same order
            content, calls = await raw_call(client, url, body, headers)
            if not calls:
                if content != FINAL_TEXT or len(messages) != 2 + 2 * ITERATIONS:
                    raise AssertionError("raw: unexpected turn")
                messages.append({"role": "assistant", "content": content})
                return
            add_tool_round(messages, content, calls)
        raise AssertionError("raw: too many iterations")

    return turn


async def raw_phase(
    fake: Fake, template: dict[str, Any], n: int, limits: httpx.Limits, phase: Phase
) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits, trust_env=False) as client:
        turn = raw_turn(client, fake.base_url, template)

        async def timed() -> None:
            start = time.perf_counter()
            await turn()
            phase.latencies_ms.append((time.perf_counter() - start) * 1000)

        async with measuring(phase, fake):
            await asyncio.gather(*(timed() for _ in range(n)))


# ---------------------------------------------------------------------- Parley


class BenchStream:
    """A reply stream that only notes when (and with what) the run finished."""

    def __init__(self, owner: BenchResponder) -> None:
        self.owner = owner

    def __call__(self, event: LoopEvent) -> None:
        pass

    async def finish(self, text: str) -> None:
        self.owner.final = text
        self.owner.finished = time.perf_counter()


class BenchResponder:
    """The channel end of one conversation (like tests/agentkit.py's RecordingResponder)."""

    def __init__(self) -> None:
        self.submitted = 0.0
        self.finished: float | None = None
        self.final: str | None = None
        self.sent: list[str] = []

    async def send(self, text: str) -> None:
        self.sent.append(text)

    def stream(self) -> BenchStream:
        return BenchStream(self)

    async def approve(self, request: object) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        yield


def make_app(fake: Fake, root: Path, state: Path, client: httpx2.AsyncClient) -> App:
    """The App on a fresh store in `state`; the workspace (named in the system prompt, so
    in every request) is the same for every phase."""
    workspace = root / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    config = parse_config(
        {
            "default_provider": PROVIDER,
            "providers": {
                PROVIDER: {
                    "kind": "openai_chat",
                    "base_url": fake.base_url,
                    "model": MODEL,
                    "max_output_tokens": MAX_OUTPUT_TOKENS,
                }
            },
            "store": {
                "path": str(state / "parley.db"),
                "events_log": str(state / "events.jsonl"),
            },
            "tools": {
                "workspace": str(workspace),
                "artifacts_dir": str(state / "artifacts"),
                "tools_file": None,
            },
            # Five calls of one tool would draw the loop guard's nudge (an extra message),
            # and the raw loop's requests would no longer be the same bytes.
            "agent": {"loop_detection": False},
        }
    )
    app = App(config, {}, build_registry(config, {}))
    app.registry.add(LookupTool())
    # The provider as the App builds it, but on the client with the benchmark's pool limits.
    app.providers[PROVIDER] = build_provider(app.settings(PROVIDER), client=client)
    return app


class StoreTimer:
    """Wraps the store's group commit and its durable `write()` (on this instance only) to
    count statements and aiosqlite round trips and to time commits and the waits on them."""

    def __init__(self, agent: Agent) -> None:
        store = agent.store
        self.commit, self.write = store._commit, store.write
        self.statements = 0
        self.round_trips = 0  # BEGIN, one execute/executemany per run of equal SQL, COMMIT
        self.commit_s = 0.0
        self.wait_s = 0.0
        store._commit = self.timed_commit  # type: ignore[method-assign]
        store.write = self.timed_write  # type: ignore[method-assign]

    async def timed_commit(self, statements: list[Any]) -> dict[int, Exception]:
        start = time.perf_counter()
        try:
            return await self.commit(statements)
        finally:
            self.commit_s += time.perf_counter() - start
            self.statements += len(statements)
            runs = sum(
                1 for i, st in enumerate(statements) if not i or statements[i - 1][0] != st[0]
            )
            self.round_trips += runs + 2

    async def timed_write(self, sql: str, params: Sequence[Any] = ()) -> None:
        start = time.perf_counter()
        try:
            await self.write(sql, params)
        finally:
            self.wait_s += time.perf_counter() - start


async def parley_phase(fake: Fake, root: Path, n: int, limits: httpx.Limits, phase: Phase) -> None:
    with tempfile.TemporaryDirectory(prefix="phase-", dir=root) as state:
        # Parley's own HTTP stack (httpx2), with the raw loop's timeout and pool limits
        timeout = httpx2.Timeout(TIMEOUT.read, connect=TIMEOUT.connect)
        pool = httpx2.Limits(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
        )
        async with httpx2.AsyncClient(timeout=timeout, limits=pool, trust_env=False) as client:
            app = make_app(fake, root, Path(state), client)
            try:
                agent = await app.open_agent()
                try:
                    await run_parley(agent, fake, n, phase)
                finally:
                    await app.close_agent(agent, grace=5.0)
            finally:
                await app.aclose()


async def run_parley(agent: Agent, fake: Fake, n: int, phase: Phase) -> None:
    responders = [BenchResponder() for _ in range(n)]
    timer = StoreTimer(agent)
    commits0 = agent.store.commits

    async def submit(i: int) -> None:
        responders[i].submitted = time.perf_counter()
        inbound = Inbound(
            "bench",
            f"c{i}",
            "",
            user_id="u1",
            user_name="bench",
            text=USER_TEXT,
            is_dm=True,
            event_id=f"bench-{i}",
        )
        if not await agent.submit(inbound, responders[i]):
            raise AssertionError("parley: submission dropped")

    async with measuring(phase, fake):
        await asyncio.gather(*(submit(i) for i in range(n)))
        await agent.wait_idle()
    phase.commits = agent.store.commits - commits0
    phase.statements, phase.round_trips = timer.statements, timer.round_trips
    phase.commit_s, phase.store_wait_s = timer.commit_s, timer.wait_s
    for r in responders:
        if r.final != FINAL_TEXT or r.finished is None:
            raise AssertionError(f"parley: unexpected answer {r.final!r} (posts {r.sent})")
        phase.latencies_ms.append((r.finished - r.submitted) * 1000)
    lanes = agent.lanes.values()
    if sorted(lane.last_state or "" for lane in lanes) != ["completed"] * n:
        raise AssertionError("parley: not every run completed")


# ---------------------------------------------------------------------- the run


async def bench(
    n: int, warmup: int, reps: int, limits: httpx.Limits, *, fake_in_process: bool = True
) -> dict[str, Any]:
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as tmp:
        async with running_fake(fake_in_process) as fake:
            template = await run_phases(fake, Path(tmp), n, warmup, reps, limits, runs)
    result: dict[str, Any] = {
        "conversations": n,
        "reps": reps,
        "tool_iterations_per_turn": ITERATIONS,
        "llm_calls_per_turn": CALLS,
        "fake_llm": "in process" if fake_in_process else "child process",
        "pool": {
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
        },
        "request_body_bytes": len(json.dumps(template)),
        "tools_sent": len(template.get("tools", [])),
        "latencies": {},
    }
    for latency_ms in LATENCIES_MS:
        by_side = {side: combine(runs[(latency_ms, side)]) for side in SIDES}
        ratio: dict[str, float | None] = {}
        for key, value in by_side["parley"].items():
            other = by_side["raw"][key]
            ok = isinstance(value, int | float) and isinstance(other, int | float) and other
            # Growth depends on what the earlier phase left free to reuse: no ratio.
            ratio[key] = value / other if ok and key != "rss_growth_mib" else None
        floor_ms = CALLS * latency_ms
        result["latencies"][str(latency_ms)] = {
            **by_side,
            "ratio": ratio,
            "floor_ms": floor_ms,
            "p99_over_floor": {
                side: by_side[side]["p99_ms"] / floor_ms if floor_ms else None for side in SIDES
            },
            "runs": {side: runs[(latency_ms, side)] for side in SIDES},
        }
    return result


async def run_phases(
    fake: Fake,
    root: Path,
    n: int,
    warmup: int,
    reps: int,
    limits: httpx.Limits,
    runs: dict[tuple[int, str], list[dict[str, Any]]],
) -> dict[str, Any]:
    """Warm-up, the same-bytes check, then every measured phase; returns the template."""
    # Warm-up (imports, caches, first connections); Parley's first request becomes the
    # raw side's template.
    await parley_phase(fake, root, warmup, limits, Phase("parley", 0, warmup))
    template = fake.template()
    if template is None:
        raise AssertionError("no Parley request seen in the warm-up")
    await raw_phase(fake, template, warmup, limits, Phase("raw", 0, warmup))
    await same_bytes(fake, root, template, limits)
    for latency_ms in LATENCIES_MS:
        fake.set_latency(latency_ms / 1000)
        for _ in range(reps):
            for side in ("raw", "parley"):
                phase = Phase(side, latency_ms, n)
                if side == "raw":
                    await raw_phase(fake, template, n, limits, phase)
                else:
                    await parley_phase(fake, root, n, limits, phase)
                runs.setdefault((latency_ms, side), []).append(phase.summary())
    if unexpected := fake.counters()[2]:
        raise AssertionError(f"fake LLM answered {unexpected} unexpected requests")
    return template


async def same_bytes(
    fake: Fake, root: Path, template: dict[str, Any], limits: httpx.Limits
) -> None:
    """One turn of each side alone: their request bodies must match (call ids aside)."""
    fake.record(True)
    await parley_phase(fake, root, 1, limits, Phase("parley", 0, 1))
    parley = fake.record(True)
    await raw_phase(fake, template, 1, limits, Phase("raw", 0, 1))
    raw = fake.record(False)
    if parley != raw:
        raise AssertionError("Parley and the raw loop sent different request bodies")


def combine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repetitions (peak RSS: the highest)."""
    out: dict[str, Any] = {}
    for key in summaries[0]:
        values = [s[key] for s in summaries if s[key] is not None]
        if not values:
            out[key] = None
        elif key == "maxrss_after_mib":
            out[key] = max(values)
        else:
            out[key] = statistics.median(values)
    return out


def render(result: dict[str, Any]) -> str:
    def num(value: float | None, digits: int = 1) -> str:
        return "—" if value is None else f"{value:,.{digits}f}"

    def ratio(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}×"

    columns = (
        ("turns/s", "turns_per_s", 1),
        ("p50 ms", "p50_ms", 0),
        ("p99 ms", "p99_ms", 0),
        ("CPU ms/turn", "cpu_ms_per_turn", 2),
        ("peak RSS MiB", "maxrss_after_mib", 1),
        ("RSS growth MiB", "rss_growth_mib", 1),
        ("TCP conns", "tcp_connections", 0),
        ("commits/turn", "commits_per_turn", 2),
        ("store wait ms/turn", "store_wait_ms_per_turn", 0),
    )
    out: list[str] = []
    for latency_ms in LATENCIES_MS:
        block = result["latencies"][str(latency_ms)]
        title = f"## fake LLM latency {latency_ms} ms"
        if latency_ms:
            title += f" (floor: {CALLS} calls × {latency_ms} ms = {block['floor_ms']:,} ms a turn)"
        head = "| side | " + " | ".join(c[0] for c in columns) + " |"
        out += [title, "", head, "|" + "---|" * (len(columns) + 1)]
        for side, label in (("parley", "Parley"), ("raw", "raw httpx")):
            cells = [num(block[side][key], digits) for _, key, digits in columns]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        cells = [ratio(block["ratio"][key]) for _, key, _ in columns]
        out += ["| ratio Parley/raw | " + " | ".join(cells) + " |", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 conversations (smoke test)")
    parser.add_argument("--conversations", type=int, metavar="N", help="default 200, quick 20")
    parser.add_argument("--reps", type=int, default=1, metavar="R", help="phases repeated (1)")
    parser.add_argument(
        "--max-connections", type=int, metavar="M", help="both clients' pool size (default N)"
    )
    parser.add_argument(
        "--keepalive", type=int, metavar="K", help="both clients' keep-alive connections (M)"
    )
    parser.add_argument(
        "--fake-process",
        action="store_true",
        help="run the fake LLM in a child process (client-side CPU and latency only)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the numbers here")
    args = parser.parse_args(argv)
    n = args.conversations or (20 if args.quick else 200)
    pool = args.max_connections or n
    keepalive = pool if args.keepalive is None else args.keepalive
    limits = httpx.Limits(max_connections=pool, max_keepalive_connections=keepalive)
    warmup = min(n, 5 if args.quick else 20)
    reps = max(1, args.reps)

    result = asyncio.run(bench(n, warmup, reps, limits, fake_in_process=not args.fake_process))
    zero, slow = result["latencies"]["0"], result["latencies"][str(LATENCIES_MS[-1])]

    print(
        f"# Concurrency: {n} conversations at once, {ITERATIONS} tool iterations a turn "
        f"({CALLS} LLM calls), Parley's durable agent vs a raw httpx loop"
        + (f" (median of {reps} runs)" if reps > 1 else "")
        + "\n"
    )
    where = (
        "The fake LLM server runs in the same process and event loop, so its CPU (aiohttp, "
        "request validation, SSE encoding) is in both CPU columns and competes with both "
        "clients for the one event loop."
        if not args.fake_process
        else "The fake LLM server runs in a child process: CPU and RSS are the client's only."
    )
    print(
        f"> Notes: {where} Requests are the same bytes on both sides, call ids aside "
        f"(checked on one turn of each before measuring; {result['request_body_bytes']:,}-byte "
        f"first body, {result['tools_sent']} tools; Parley's loop detection off). "
        f"Both clients: httpx {httpx.__version__} pool max_connections={pool}, "
        f"max_keepalive_connections={keepalive}. Latency: submission → final answer; p99 is "
        "nearest-rank. Peak RSS is `ru_maxrss` after the phase (process-wide and monotone; "
        "phases run raw then Parley, 0 ms then 200 ms, after a warm-up of both); RSS growth "
        "is the highest RSS sampled every 50 ms during the phase minus RSS at its start "
        "(/proc/self/statm). Commits: the store's group commits per turn; store wait: time a "
        "turn spent awaiting durable writes.\n"
    )
    print(render(result))
    tput = zero["ratio"]["turns_per_s"]
    p99 = slow["p99_over_floor"]
    print(f"throughput at 0 ms: Parley/raw = {tput:.2f}× (goal ≥ 0.7×)")
    print(
        f"p99 at {LATENCIES_MS[-1]} ms: Parley {p99['parley']:.2f}× the "
        f"{slow['floor_ms']:,} ms floor, raw {p99['raw']:.2f}× (goal ≤ 1.2×)"
    )
    for latency_ms in LATENCIES_MS:
        parley = result["latencies"][str(latency_ms)]["parley"]
        share = 100 * parley["store_wait_ms_per_turn"] / parley["p50_ms"]
        print(
            f"store at {latency_ms} ms: {parley['commits_per_turn']:.2f} commits and "
            f"{parley['statements_per_turn']:.0f} statements per turn, "
            f"{parley['round_trips_per_commit']:.0f} aiosqlite round trips and "
            f"{parley['commit_ms']:.1f} ms per commit; a turn waits "
            f"{parley['store_wait_ms_per_turn']:.0f} ms on durable writes ({share:.0f}% of p50)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
