"""What a big message leaves in a worker's memory, through the real durable agent (store,
lanes, checkpoints) and the fake LLM: short conversations never load the tokenizer; the
first 100 KB message loads it once (docs/benchmarks.md#memory-after-a-big-message), and
besides it every big message leaves no more than its own text in the conversation it
joined. Counted in Python allocations (`tracemalloc`), which do not depend on timing or
on what the allocator keeps."""

from __future__ import annotations

import gc
import itertools
import sys
import tracemalloc
from pathlib import Path

import pytest
import tiktoken.registry

from bot.app import App, build_registry
from core.agent import Agent
from tests.agentkit import RecordingResponder, agent_config, inbound
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply

SIZE = 100_000
BIG = ("Our deploy log, pasted whole: step ok; " * (SIZE // 38 + 1))[:SIZE]
# Allocations not Parley's: the tokenizer's (tiktoken and its bundled encoding's package),
# modules imported (which ones is checked apart), the fake LLM's, which shares the process
# (its server is aiohttp's), and this test's own (its event loop's handles, its lists).
TOKENIZER = ("tiktoken",)
NOT_OURS = (
    "tiktoken", "<frozen importlib", "/tests/fakes/", "/aiohttp/", tracemalloc.__file__,
    __file__,
)  # fmt: skip


def held(snapshot: tracemalloc.Snapshot) -> tuple[int, int]:
    """(bytes held by the tokenizer, by everything but the allocations not Parley's)."""
    tokenizer = ours = 0
    # Grouped by traceback in one pass: a per-trace filter over the encoding's ~200,000
    # objects takes minutes.
    for stat in snapshot.statistics("traceback"):
        files = [frame.filename for frame in stat.traceback]
        if any(name in f for f in files for name in TOKENIZER):
            tokenizer += stat.size
        if not any(name in f for f in files for name in NOT_OURS):
            ours += stat.size
    return tokenizer, ours


async def test_the_tokenizer_is_all_a_first_big_message_leaves_behind(
    fake_llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tiktoken keeps loaded encodings per process: start empty so the load happens here.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})

    def answer(request: RecordedRequest) -> Reply:
        fake_llm.requests.clear()  # the fake shares the process: keep none of its copies
        return Reply(text="Noted.")

    fake_llm.responder = answer
    # A window a 100 KB paste fits in, as today's models have.
    config = agent_config(fake_llm, tmp_path, providers={"fake": {"context_window": 128_000}})
    app = App(config, {}, build_registry(config, {}))
    agent = await app.open_agent()
    responder = RecordingResponder()

    async def converse(agent: Agent, name: str, text: str) -> tuple[int, int]:
        await agent.submit(inbound(text, key=("test", name, ""), event_id=name), responder)
        await agent.wait_idle()
        assert responder.finals[-1] == "Noted."
        gc.collect()
        return held(tracemalloc.take_snapshot()) if tracemalloc.is_tracing() else (0, 0)

    try:
        # Imports, caches, the first connections: traced, the price table's module alone
        # takes half a minute to import.
        for n in range(3):
            await converse(agent, f"short{n}", "When is the release?")
        tracemalloc.start(3)  # deep enough to see tiktoken under base64's allocations
        start = await converse(agent, "short", "And the one after?")
        assert not app.counter.loaded  # short conversations never load it
        modules = set(sys.modules)
        first = await converse(agent, "big1", BIG)
        assert app.counter.loaded
        imported = {name.split(".")[0] for name in set(sys.modules) - modules}
        assert imported <= {"tiktoken", "tiktoken_ext"}  # the tokenizer, nothing else
        later = [first]
        for n in (2, 3):
            later.append(await converse(agent, f"big{n}", BIG))
    finally:
        tracemalloc.stop()
        await app.close_agent(agent)
        await app.aclose()
    # Each conversation holds its message (its lane is kept); a second copy of the text,
    # or its tokens, kept anywhere would double that.
    assert first[1] - start[1] < 1.6 * SIZE, (first, start)
    for before, after in itertools.pairwise(later):
        assert after[1] - before[1] < 1.6 * SIZE, (after, before)
        assert after[0] == before[0]  # the tokenizer: loaded once, never again
