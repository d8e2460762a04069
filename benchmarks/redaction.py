"""What scrubbing the configured secrets costs per message (`core.secrets`).

Every text that leaves Parley passes `SECRETS.scrub`: each store write's strings, each
events-log line, each log record, each channel post, each terminal write. This measures
one call on texts of the sizes those are (a log line, an answer, a tool output) with a
realistic number of secrets (an API key and a bot token; a full house of providers,
channels, the store password and tools.yaml tokens), clean and holding one secret, and
what registering the secrets costs at start-up; then the scrubbing one durable turn of
the real agent does (store writes, events, log lines), per tool iteration.

Run from the repo root: `.venv/bin/python benchmarks/redaction.py [--quick]`.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.secrets import SecretRegistry  # noqa: E402

SIZES = (("log line", 120), ("answer", 2_000), ("tool output", 20_000))
EVENT = '{"provider": "openai/gpt-4o", "latency_ms": 812.4, "input_tokens": 5012}'
PREFIXES = ("sk-proj-", "sk-ant-api03-", "xoxb-", "xapp-1-", "", "ghp_", "123456789:AA")


def secrets(count: int, rnd: random.Random) -> dict[str, str]:
    """`count` token-shaped secrets (48 random characters after a vendor's prefix)."""
    alphabet = string.ascii_letters + string.digits
    return {
        f"SECRET_{i}": PREFIXES[i % len(PREFIXES)] + "".join(rnd.choices(alphabet, k=48))
        for i in range(count)
    }


def prose(size: int, rnd: random.Random) -> str:
    """`size` characters of README text (English, code, JSON-ish): what posts look like."""
    text = (REPO / "README.md").read_text()
    start = rnd.randrange(0, len(text) - size)
    return text[start : start + size]


def per_call_us(fn: object, text: str, budget: float) -> float:
    """µs per call of `fn(text)`: the mean of as many calls as fit in `budget` seconds."""
    assert callable(fn)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget:
        for _ in range(50):
            fn(text)
        calls += 50
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    budget = 0.05 if parser.parse_args().quick else 0.5
    rnd = random.Random(7)
    print("| secrets | spellings | text | size | clean µs | with a secret µs | register ms |")
    print("|---|---|---|---|---|---|---|")
    for count in (2, 10):
        values = secrets(count, rnd)
        registry = SecretRegistry()
        start = time.perf_counter()
        registry.add_all(values.items())
        register_ms = (time.perf_counter() - start) * 1e3
        spellings = len(registry._matcher.names) if registry._matcher else 0
        one = next(iter(values.values()))
        for label, size in SIZES:
            clean = prose(size, rnd)
            hit = clean[: size // 2] + one + clean[size // 2 :]
            assert registry.scrub(clean) is clean
            assert one not in registry.scrub(hit)
            clean_us = per_call_us(registry.scrub, clean, budget)
            hit_us = per_call_us(registry.scrub, hit, budget)
            print(
                f"| {count} | {spellings} | {label} | {size:,} | {clean_us:.1f} | "
                f"{hit_us:.1f} | {register_ms:.1f} |"
            )
        event = (time.time(), "r-0123456789ab", "telegram:111:", 3, "agent.llm.call", EVENT)
        event_us = per_call_us(registry.scrub_params, event, budget)
        print(
            f"| {count} | {spellings} | an event row's parameters | {len(EVENT)} | "
            f"{event_us:.1f} | - | - |"
        )


async def durable_turn(iterations: int, values: dict[str, str]) -> tuple[int, float, float]:
    """One turn of the real agent on a SQLite store, `iterations` `read_file` calls of
    2 KB files, with `values` registered: scrub calls made, their µs in all, the turn's ms."""
    import tempfile

    from core import secrets as module
    from tests.agentkit import RecordingResponder, inbound, running_agent
    from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

    spent = [0, 0.0]
    scrub = module._Matcher.scrub

    def timed(self: module._Matcher, text: str) -> str:
        start = time.perf_counter()
        try:
            return scrub(self, text)
        finally:
            spent[0] += 1
            spent[1] += time.perf_counter() - start

    module._Matcher.scrub = timed  # type: ignore[method-assign]
    module.SECRETS.clear()
    module.SECRETS.add_all(values.items())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with FakeLLM() as fake:
                calls = [ToolCallSpec("read_file", {"path": f"{i}.md"}) for i in range(iterations)]
                fake.script(*(Reply(tool_calls=[call]) for call in calls))
                fake.script(Reply(text="done"))
                async with running_agent(fake, Path(tmp)) as agent:
                    for i in range(iterations):  # different files: no loop to detect
                        text = prose(2_000, random.Random(i))
                        (Path(tmp) / "workspace" / f"{i}.md").write_text(text)
                    start = time.perf_counter()
                    await agent.submit(inbound("read it"), RecordingResponder())
                    await agent.wait_idle()
                    turn_ms = (time.perf_counter() - start) * 1e3
    finally:
        module._Matcher.scrub = scrub  # type: ignore[method-assign]
        module.SECRETS.clear()
    return spent[0], spent[1] * 1e6, turn_ms


def turn_table(quick: bool) -> None:
    import asyncio

    iterations = 5 if quick else 20
    print()
    print("One durable turn of `read_file` calls on 2 KB files (SQLite store):")
    print()
    print("| secrets | iterations | scrub calls | scrub µs per iteration | turn ms |")
    print("|---|---|---|---|---|")
    asyncio.run(durable_turn(iterations, {}))  # warm-up: imports, first connections
    for count in (2, 10):
        calls, us, turn_ms = asyncio.run(durable_turn(iterations, secrets(count, random.Random(3))))
        print(f"| {count} | {iterations} | {calls} | {us / iterations:.0f} | {turn_ms:.0f} |")


if __name__ == "__main__":
    main()
    turn_table("--quick" in sys.argv)
