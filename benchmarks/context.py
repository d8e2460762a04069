"""Cost of context-pressure management (docs/context.md).

* **Pre-flight below the soft threshold**: µs per call at 10 … 5,000 messages, one new tool
  turn appended before each call (the loop's pattern). The incremental path checks and
  counts only the new messages, so it should stay flat; the "full scan" column is the same
  work done from scratch each call (a fresh manager: validity of every message, sum of the
  cached counts) for contrast.
* **R1 compaction** of a ~150k-token history (window 200k, so it is over `compact`): one
  pre-flight that masks, builds the bounded summary input, pins tool results and rebuilds
  the history. The summary call itself is excluded (a fixed summarizer); goal < 50 ms.

Usage (from the repo root)::

    .venv/bin/python benchmarks/context.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.context.manager import ContextManager, ContextSettings  # noqa: E402
from core.context.tokens import TokenCounter  # noqa: E402
from core.events import discard  # noqa: E402
from core.messages import Message, ToolCall  # noqa: E402

SIZES = (10, 100, 1_000, 5_000)
TOOLS = ("search", "read_file", "bash", "list_directory", "fetch", "grep")


def turn(i: int, result_words: int = 60, answer_words: int = 0) -> list[Message]:
    """A user request, a tool call, its result and an answer: four messages."""
    call = ToolCall(id=f"call_{i}", name=TOOLS[i % len(TOOLS)], arguments='{"q": "x"}')
    result = " ".join(f"line{i}-{j} value={j * 7}" for j in range(result_words))
    detail = " ".join(f"point {j} of item {i} checked" for j in range(answer_words))
    return [
        Message.user(f"request {i}: please look into item {i} and report back"),
        Message.assistant("", (call,)),
        Message.tool_result(call, result),
        Message.assistant(f"item {i} looks fine; found {result_words} entries. {detail}"),
    ]


def history(n_messages: int, result_words: int = 60, answer_words: int = 0) -> list[Message]:
    out = [Message.system("You are Parley, a helpful assistant.")]
    i = 0
    while len(out) < n_messages:
        out += turn(i, result_words, answer_words)
        i += 1
    return out[:n_messages]


async def preflight_us(n: int, calls: int, counter: TokenCounter) -> tuple[float, float]:
    """Median µs per pre-flight call: incremental, and from scratch."""
    messages = history(n)
    manager = ContextManager(10**9, counter, None, ContextSettings())
    await manager.preflight(messages, discard)  # counts (and caches) the history once
    new = [m for i in range(calls) for m in turn(10**6 + i)[1:3]]
    counter.messages(new)  # counting a new message is the same cost either way
    inc, full = [], []
    # Two separate loops: interleaving them lets the full scans evict the caches.
    for k in range(calls):
        messages += new[2 * k : 2 * k + 2]
        start = time.perf_counter()
        await manager.preflight(messages, discard)
        inc.append(time.perf_counter() - start)
    messages = history(n)
    counter.messages(messages)  # cached, as it would be in a running conversation
    for _ in range(calls):
        fresh = ContextManager(10**9, counter, None, ContextSettings())  # not timed
        start = time.perf_counter()
        await fresh.preflight(messages, discard)
        full.append(time.perf_counter() - start)
    return statistics.median(inc) * 1e6, statistics.median(full) * 1e6


async def fixed_summary(_prompt: str) -> str:
    return "The user asked for a review of many items; all were checked and looked fine."


async def r1_ms(reps: int, counter: TokenCounter) -> tuple[int, int, float]:
    """(tokens before, after, median ms) of one R1 pre-flight on a ~150k-token history."""
    times: list[float] = []
    before = after = 0
    for _ in range(reps):
        # Long answers rather than tool output, so masking alone cannot avoid R1.
        messages = history(1_900, result_words=6, answer_words=31)
        manager = ContextManager(200_000, counter, fixed_summary, ContextSettings())
        before = manager.tokens(messages)  # counting the history is not part of R1
        start = time.perf_counter()
        await manager.preflight(messages, discard)
        times.append(time.perf_counter() - start)
        after = manager.tokens(messages)
        assert manager.last_compaction is not None
        assert manager.last_compaction.kind == "R1", manager.last_compaction
    return before, after, statistics.median(times) * 1e3


async def run(quick: bool) -> None:
    counter = TokenCounter()
    calls = 20 if quick else 200
    print("| messages | pre-flight, incremental (µs/call) | full scan (µs/call) |")
    print("|---:|---:|---:|")
    for n in SIZES:
        inc, full = await preflight_us(n, calls, counter)
        print(f"| {n:,} | {inc:.1f} | {full:.1f} |")
    before, after, ms = await r1_ms(2 if quick else 7, counter)
    print()
    print("| R1 compaction (summary call excluded) | tokens before | tokens after | ms |")
    print("|---|---:|---:|---:|")
    print(f"| mask + summary input + pins + rebuild | {before:,} | {after:,} | {ms:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (< 10 s)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
