"""What instrumentation costs per loop iteration: metrics (and traces) on versus off, in
the same process, interleaved (docs/operations.md#what-it-costs).

The real agent (`App.open_agent`, SQLite store, events log) answers turns from the fake
LLM (`tests.fakes.llm`, zero latency): a K turn makes K `read_file` calls, one per LLM
call, then answers. Per-iteration figure = (median turn time at K - at K=0) / K, wall and
process CPU, per mode; modes alternate within every rep (off, on, on, off, …) so a loaded
machine slows them alike. Modes: `off` (no registry: every hook is one global read), `metrics`
(`core.metrics.enable()`, as with `[server] listen`), and `traces` (metrics plus an
OpenTelemetry SDK tracer whose spans go to an in-memory exporter; only with the
`parley[otel]` extra installed).

Usage (from the repo root)::

    .venv/bin/python benchmarks/metrics_overhead.py [--reps 5] [--k 20] [--inner 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bot.app import App, build_registry  # noqa: E402
from bot.config import parse_config  # noqa: E402
from core import metrics, tracing  # noqa: E402
from core.chat import Inbound  # noqa: E402
from tests.agentkit import RecordingResponder  # noqa: E402
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec  # noqa: E402


def _responder(k: int) -> Callable[[RecordedRequest], Reply]:
    def answer(request: RecordedRequest) -> Reply:
        done = sum(1 for m in request.json["messages"] if m["role"] == "tool")
        if done < k:
            return Reply(tool_calls=[ToolCallSpec("read_file", {"path": "data.txt"})])
        return Reply(text="done " * 50, chunk_size=40)

    return answer


def _tracer() -> tuple[Any, Any] | None:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
    except ImportError:
        return None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("parley"), exporter


def _mode(name: str, tracer: tuple[Any, Any] | None) -> None:
    metrics.disable()
    tracing.disable()
    if name in ("metrics", "traces"):
        metrics.enable()
    if name == "traces" and tracer is not None:
        tracer[1].clear()
        tracing.enable(tracer[0])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--inner", type=int, default=3)
    parser.add_argument("--modes", default="off,metrics,traces", help="from off,metrics,traces")
    args = parser.parse_args()
    tracer = _tracer()
    modes = [m for m in args.modes.split(",") if m != "traces" or tracer is not None]
    assert modes[0] == "off", "the first mode is the baseline: off"
    seq = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "ws").mkdir()
        (state / "ws" / "data.txt").write_text("some data\n" * 20)
        async with FakeLLM() as fake:
            config = parse_config(
                {
                    "default_provider": "fake",
                    "providers": {
                        "fake": {
                            "kind": "openai_chat",
                            "base_url": fake.base_url,
                            "model": "fake-model",
                        }
                    },
                    "agent": {"max_iterations": args.k + 1, "loop_detection": False},
                    "store": {
                        "path": str(state / "parley.db"),
                        "events_log": str(state / "events.jsonl"),
                    },
                    "tools": {
                        "workspace": str(state / "ws"),
                        "workspace_scope": "shared",
                        "artifacts_dir": str(state / "artifacts"),
                        "tools_file": None,
                    },
                }
            )
            app = App(config, {}, build_registry(config, {}))
            agent = await app.open_agent(None)

            async def turn(k: int) -> tuple[float, float]:
                fake.responder = _responder(k)
                inbound = Inbound(
                    "bench", f"c{next(seq)}", "", text="go", user_id="u", user_name="u",
                    is_dm=True,
                )  # fmt: skip
                wall, cpu = time.perf_counter(), time.process_time()
                report = await agent.run(inbound, RecordingResponder())
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert report.state == "completed", report
                return wall, cpu

            for name in modes:  # warm-up
                _mode(name, tracer)
                await turn(2)
            figures: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            for rep in range(args.reps):
                order = modes if rep % 2 == 0 else list(reversed(modes))
                for name in order:
                    _mode(name, tracer)
                    zero = [await turn(0) for _ in range(args.inner)]
                    many = [await turn(args.k) for _ in range(args.inner)]
                    per = tuple(
                        (statistics.median(t[i] for t in many) - statistics.median(t[i] for t in zero))  # noqa: E501
                        / args.k
                        for i in (0, 1)
                    )  # fmt: skip
                    figures[name].append(per)  # type: ignore[arg-type]
            accounted = await _account(turn, args.k)
            _mode("off", tracer)
            await app.close_agent(agent, grace=5)
            await app.aclose()

    base_wall = statistics.median(f[0] for f in figures["off"])
    base_cpu = statistics.median(f[1] for f in figures["off"])
    print(
        f"per-iteration figure, K={args.k}, {args.reps} interleaved reps ({args.inner} turns each)"
    )
    print(f"{'mode':<8} {'wall ms':>8} {'cpu ms':>8} {'wall vs off':>12} {'cpu vs off':>11}")
    for name in modes:
        wall = statistics.median(f[0] for f in figures[name])
        cpu = statistics.median(f[1] for f in figures[name])
        print(
            f"{name:<8} {wall * 1000:8.3f} {cpu * 1000:8.3f} "
            f"{(wall / base_wall - 1) * 100:+11.1f}% {(cpu / base_cpu - 1) * 100:+10.1f}%"
        )

    print()
    print("metrics hooks per loop iteration, counted, each timed alone (timeit):")
    total = 0.0
    for hook, (calls, micros) in sorted(accounted.items()):
        total += calls * micros
        print(f"  {hook:<16} {calls:5.2f} calls x {micros:6.2f} us")
    share = total / 1000 / (base_cpu * 1000) * 100
    print(f"  = {total:.1f} us per iteration: {share:.2f} % of the per-iteration CPU (off)")


HOOKS = (
    "event", "llm_call", "llm_first_token", "llm_error", "tool_call", "approval",
    "channel_call", "channel_retry", "store_commit", "store_failed_write", "heartbeat",
)  # fmt: skip


async def _account(
    turn: Callable[[int], Any], k: int, turns: int = 3
) -> dict[str, tuple[float, float]]:
    """Per hook: calls per loop iteration (metrics on) and the cost of one call."""
    import timeit

    metrics.disable()
    tracing.disable()
    metrics.enable()
    calls: dict[str, list[tuple[Any, ...]]] = {h: [] for h in HOOKS}
    originals = {h: getattr(metrics, h) for h in HOOKS}

    def counting(hook: str) -> Callable[..., None]:
        def call(*a: Any) -> None:
            calls[hook].append(a)
            originals[hook](*a)

        return call

    for hook in HOOKS:
        setattr(metrics, hook, counting(hook))
    try:
        counts = []
        for kk in (0, k):
            for c in calls.values():
                c.clear()
            for _ in range(turns):
                await turn(kk)
            counts.append({h: (len(c), c[0] if c else None) for h, c in calls.items()})
    finally:
        for hook, fn in originals.items():
            setattr(metrics, hook, fn)
    found: dict[str, tuple[float, float]] = {}
    for hook in HOOKS:
        per = (counts[1][hook][0] - counts[0][hook][0]) / (turns * k)
        sample = counts[1][hook][1]
        if per <= 0 or sample is None:
            continue
        fn = originals[hook]
        n = 20000
        micros = timeit.timeit(lambda fn=fn, a=sample: fn(*a), number=n) / n * 1e6
        found[hook] = (per, micros)
    metrics.disable()
    return found


if __name__ == "__main__":
    asyncio.run(main())
