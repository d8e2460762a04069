"""Subgoal-aware compaction (docs/context.md#context-strategies): one
test per Key Invariant, then the registry's arithmetic, the reply protocol and the config."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bot.config import parse_config
from core.context.eviction import (
    OFF_LOOP_BLOCKS,
    block_scores,
    ranked_render,
    ranked_render_async,
)
from core.context.manager import SUMMARY_HEADER, ContextManager, ContextSettings
from core.context.subgoals import (
    SUBGOAL_PROMPT,
    SubgoalRegistry,
    SubgoalTracker,
    parse_reply,
    same_subgoal,
)
from core.context.summarize import provider_summarizer
from core.context.transcript import is_valid
from core.errors import ConfigError
from core.loop import Guards, run_loop
from core.messages import Message
from core.providers.scripted import ScriptedProvider, ScriptedReply, tool_call
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.conftest import provider_for
from tests.context import Sink, WordCounter, system, tool_turn, user
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.helpers import EchoTool

WINDOW = 1000


class Recorder:
    """A summarizer that answers `text` and records its prompts."""

    def __init__(self, text: str = "the user asked for things") -> None:
        self.text = text
        self.inputs: list[str] = []

    async def __call__(self, prompt: str) -> str:
        self.inputs.append(prompt)
        return self.text


def manager(strategy: str = "subgoal", summarizer: Recorder | None = None) -> ContextManager:
    settings = ContextSettings(strategy=strategy)  # type: ignore[arg-type]
    return ContextManager(WINDOW, WordCounter(), summarizer or Recorder(), settings)


def history(turns: int = 10, result: int = 30, system_tokens: int = 400) -> list[Message]:
    body = [user(40, "task")]
    body += [m for i in range(turns) for m in tool_turn(f"t{i}", "search", result, tag=f"r{i}")]
    return [system(system_tokens), *body]


def tracked(cm: ContextManager) -> SubgoalTracker:
    assert cm.subgoals is not None
    return cm.subgoals


# ---- Key invariants (docs/context.md) ------------------------------------------------------------


async def test_extraction_is_fire_and_forget_the_turn_never_waits_for_it(
    fake_llm: FakeLLM,
) -> None:
    """Invariant: never block the agent turn on the subgoal LLM call. The extraction call
    hangs at the fake server while the loop makes three LLM calls and runs two tools."""
    release = asyncio.Event()

    async def hang(request: RecordedRequest) -> Reply:
        await release.wait()
        return Reply(text="SUBGOAL: echo things twice")

    fake_llm.responder = hang
    extractor = provider_summarizer(provider_for(fake_llm))
    settings = ContextSettings(strategy="subgoal")
    cm = ContextManager(100_000, WordCounter(), extractor, settings)
    main = ScriptedProvider(
        [
            ScriptedReply(tool_calls=[tool_call("echo", {"text": "a"})]),
            ScriptedReply(tool_calls=[tool_call("echo", {"text": "b"})]),
            ScriptedReply("done"),
        ]
    )
    tools = ToolExecutor(ToolRegistry([EchoTool()]), ToolPolicy(), ToolContext(SandboxSettings()))
    messages = [Message.system("You are a test."), Message.user("echo a, then b")]
    outcome = await run_loop(messages, main, tools, guards=Guards(context=cm))
    assert outcome.text == "done"
    assert len(main.requests) == 3  # every step ran while the extraction hung
    await fake_llm.wait_for_requests(1)
    assert len(fake_llm.requests) == 1  # at most one extraction in flight
    assert cm.subgoal_status() == "none yet"
    release.set()
    await tracked(cm).settle()
    assert cm.subgoal_status() == "echo things twice"
    assert tracked(cm).registry.active_start() == 1  # the first one tags what came before


async def test_active_messages_survive_compaction_and_come_back_after_the_pinned_ones() -> None:
    """Invariant: active-subgoal messages are taken out before the drain and re-inserted
    after it (system, summary, the request kept verbatim), never lost."""
    cm = manager()
    messages = history(system_tokens=380)  # 780 tokens: R1 is enough
    registry = tracked(cm).registry
    registry.sync(messages)
    registry.open("look around", 2)
    registry.open("search deeply", 10)  # turns t4..t9: 12 messages, more than keep_tail
    active = messages[10:]
    sink = Sink()
    assert await cm.preflight(messages, sink) == "ok"
    assert sink.named("agent.compaction.run")[-1]["kind"] == "R1"
    assert messages[0].role == "system"
    assert messages[1].content.startswith(SUMMARY_HEADER)
    assert messages[2].content.startswith("task task")  # the latest request, verbatim
    assert messages[3:] == active
    assert all(a is b for a, b in zip(messages[3:], active, strict=True))
    assert registry.active_start() == 3
    assert is_valid(messages)


async def test_the_summary_strategy_would_have_lost_them() -> None:
    """The contrast that makes the test above able to fail: `summary` keeps only the tail."""
    cm = manager("summary")
    messages = history(system_tokens=380)
    active = messages[10:]
    await cm.preflight(messages, Sink())
    assert len(messages) < 3 + len(active)


def test_rebuild_after_compaction_is_offset_arithmetic_without_the_messages() -> None:
    """Invariant: repair by offsets, never by scanning messages (the registry never sees
    them here)."""
    registry = SubgoalRegistry()
    registry.open("first", 1)
    registry.open("second", 5)
    registry.open("third", 9)
    registry.rebuild_after_compaction(1, 7, 2)  # 6 messages went, summary + request came
    # "first" ([1, 5)) was summarised whole; "second" ([5, 9)) lost 5 and 6 and moved down
    # by 6 - 2; "third" moved down by the same 4.
    spans = [(s.text, s.start, s.end) for s in registry.subgoals]
    assert spans == [("second", 3, 5), ("third", 5, None)]


def test_index_repair_after_summary_insertion_and_a_new_system_message() -> None:
    """Invariant: insertions (a summary, a system message put in front) shift spans."""
    registry = SubgoalRegistry()
    registry.open("a", 2)
    registry.complete(4)
    registry.open("b", 4)
    registry.insert(1, 1)  # a summary inserted after the system message
    assert [(s.start, s.end) for s in registry.subgoals] == [(3, 5), (5, None)]
    messages = [Message.user("x"), Message.assistant("y")]
    registry.sync(messages)
    messages.insert(0, Message.system("prompt"))
    registry.sync(messages)  # O(1): the old first message is now second
    assert [(s.start, s.end) for s in registry.subgoals] == [(4, 6), (6, None)]


async def test_index_repair_after_compaction_points_at_the_same_messages() -> None:
    cm = manager()
    messages = history(turns=12, result=10, system_tokens=50)  # small: no deep prune
    registry = tracked(cm).registry
    registry.sync(messages)
    registry.open("collect", 2)
    registry.open("compare", 14)
    registry.complete(20)
    registry.open("report", 20)
    old = {s.text: messages[s.start : s.end or len(messages)] for s in registry.subgoals}
    await cm.compact(messages, sink=Sink())  # keeps the last 10 messages and "report"
    kept = {s.text: messages[s.start : s.end or len(messages)] for s in registry.subgoals}
    assert list(kept) == ["compare", "report"]  # "collect" went into the summary
    assert kept["report"] == old["report"]
    assert kept["compare"] == old["compare"][-len(kept["compare"]) :]  # its kept tail
    assert all(a is b for a, b in zip(kept["report"], old["report"], strict=True))
    assert messages[1].content.startswith(SUMMARY_HEADER)


@pytest.mark.parametrize("value", ["sidequest", ["subgoal", "summary"], "subgoal+sidequest"])
def test_one_strategy_at_a_time_a_bad_value_is_a_config_error(value: object) -> None:
    """Invariant: two eviction strategies are never active together: `strategy` is one
    value; anything else is a start-up `ConfigError` naming the key and the choices."""
    raw = {
        "default_provider": "p",
        "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
        "context": {"strategy": value},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert caught.value.key == "context.strategy"
    assert "'summary', 'subgoal', 'subgoal_mig' or 'focus'" in str(caught.value)


def test_active_blocks_are_never_evicted_by_scoring() -> None:
    """Invariant: the active tier (1.0) is protected: no redundancy is subtracted, even
    for an exact repeat of a higher-scored block."""
    same = tool_turn("a", "search", 30, tag="same") + tool_turn("b", "search", 30, tag="same")
    relevance = [0.3, 0.3, 1.0, 1.0]
    assert block_scores(same, relevance, mig=True) == [pytest.approx(-0.7), 1.0]
    relevance = [1.0, 1.0, 1.0, 1.0]
    assert block_scores(same, relevance, mig=True) == [1.0, 1.0]


async def test_extraction_only_between_steps_and_one_at_a_time() -> None:
    """Invariant: extraction is started at the pre-flight between steps, not awaited, and
    not started again while one is in flight."""
    gate = asyncio.Event()
    calls: list[str] = []

    async def slow(prompt: str) -> str:
        calls.append(prompt)
        await gate.wait()
        return "SUBGOAL: read the logs"

    cm = ContextManager(100_000, WordCounter(), slow, ContextSettings(strategy="subgoal"))
    messages = history(turns=2, system_tokens=20)
    assert await cm.preflight(messages, Sink()) == "ok"  # returns with the call pending
    await asyncio.sleep(0)
    assert len(calls) == 1
    messages += tool_turn("t9", "search", 10, tag="zzlate")
    await cm.preflight(messages, Sink())
    await asyncio.sleep(0)
    assert len(calls) == 1  # the first is still in flight
    gate.set()
    await tracked(cm).settle()
    await cm.preflight(messages, Sink())  # new messages since the snapshot: a new call
    await tracked(cm).settle()
    assert len(calls) == 2
    assert "zzlate" not in calls[0]
    assert "zzlate zzlate" in calls[1]


# ---- the reply protocol, tiers, failures ---------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "actions"),
    [
        ("SUBGOAL: run the tests", [("open", "run the tests")]),
        ("**SUBGOAL:** fix `parser.py`", [("open", "fix `parser.py")]),
        ("COMPLETED:", [("complete", "")]),
        (
            "COMPLETED: done\nSUBGOAL: write the report",
            [("complete", ""), ("open", "write the report")],
        ),
        ("NONE", []),
        ("The assistant is still searching.", []),
        ("SUBGOAL:", []),
    ],
)
def test_reply_protocol(reply: str, actions: list[tuple[str, str]]) -> None:
    assert parse_reply(reply) == actions


async def test_a_new_subgoal_closes_the_active_one_and_completed_closes_it() -> None:
    script = iter(
        ["SUBGOAL: find the bug", "SUBGOAL: find the bug", "SUBGOAL: fix it", "COMPLETED:"]
    )

    async def extractor(prompt: str) -> str:
        return next(script)

    cm = ContextManager(100_000, WordCounter(), extractor, ContextSettings(strategy="subgoal"))
    tracker = tracked(cm)
    messages = history(turns=1, system_tokens=20)
    for i in range(4):
        await cm.preflight(messages, Sink())
        await tracker.settle()
        messages += [user(10, f"next{i}"), *tool_turn(f"n{i}", "search", 10)]
    texts = [(s.text, s.active) for s in tracker.registry.subgoals]
    assert texts == [("find the bug", False), ("fix it", False)]
    assert cm.subgoal_status() == "none yet"
    tiers = tracker.registry.tiers(len(messages))
    first, second = tracker.registry.subgoals
    assert tiers[first.start] == "outdated"  # completed before the latest completed one
    assert tracker.registry.tier(first.start) == "outdated"
    assert tracker.registry.tier(second.start) == "completed"
    assert tiers[second.start] == "completed"
    assert tiers[-1] == "outdated"  # after the last completion, before any new subgoal


async def test_a_failed_extraction_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(prompt: str) -> str:
        raise RuntimeError("extraction model down")

    cm = ContextManager(100_000, WordCounter(), broken, ContextSettings(strategy="subgoal"))
    messages = history(turns=1, system_tokens=20)
    assert await cm.preflight(messages, Sink()) == "ok"
    await tracked(cm).settle()
    assert tracked(cm).failures == 1
    assert "subgoal extraction failed" in caplog.text
    assert len(tracked(cm).registry.marks) == 1  # the window's marks went; "seen" stays


async def test_clear_forgets_the_subgoal() -> None:
    cm = manager(summarizer=Recorder("SUBGOAL: tidy up"))
    messages = history(turns=1, system_tokens=20)
    await cm.preflight(messages, Sink())
    await tracked(cm).settle()
    assert cm.subgoal_status() == "tidy up"
    messages.clear()  # what /clear does
    assert cm.subgoal_status() == "none yet"


async def test_masking_spares_the_active_subgoal() -> None:
    cm = ContextManager(WINDOW, WordCounter(), Recorder(), ContextSettings(strategy="subgoal"))
    messages = history(turns=10, result=30, system_tokens=300)  # 660: over soft, under compact
    registry = tracked(cm).registry
    registry.sync(messages)
    registry.open("search", 4)
    await cm.preflight(messages, Sink())
    tools = [m for m in messages if m.role == "tool"]
    assert tools[0].content.startswith("[old tool output removed")
    assert all(not m.content.startswith("[old") for m in messages[4:])


def test_ranked_render_drops_the_lowest_tier_first() -> None:
    head = tool_turn("o", "ls", 40, tag="old") + tool_turn("c", "ls", 40, tag="done")
    text = ranked_render(head, [0.1, 0.1, 0.3, 0.3], WordCounter(), budget=70)
    assert "done done" in text
    assert "old old" not in text
    assert text.startswith("[2 messages omitted]")


def test_a_restated_subgoal_is_the_same_subgoal() -> None:
    assert same_subgoal("Inspect the service logs", "inspect the service logs.")
    assert same_subgoal("inspect the service logs", "inspect the service logs again")
    assert not same_subgoal("inspect the service logs", "patch the config")


def test_a_history_rewritten_behind_its_back_resets_the_registry() -> None:
    registry = SubgoalRegistry()
    messages = [Message.system("p"), Message.user("a"), Message.assistant("b")]
    registry.sync(messages)
    registry.open("answer", 1)
    messages.append(Message.user("c"))
    messages[0] = Message.system("p, refreshed")
    registry.sync(messages)  # appends and a refreshed prompt: followed
    assert registry.active_start() == 1
    messages[:] = [Message.system("p"), Message.user("x"), Message.assistant("y"), user(5)]
    registry.sync(messages)  # same length, different messages: /clear and a new turn
    assert registry.subgoals == []


async def test_no_new_extraction_after_compaction_without_new_messages() -> None:
    recorder = Recorder("SUBGOAL: search deeply")
    cm = manager(summarizer=recorder)
    messages = history(system_tokens=380)
    await cm.preflight(messages, Sink())  # an extraction, then R1 (its summary call)
    await tracked(cm).settle()
    calls = len(recorder.inputs)
    await cm.preflight(messages, Sink())
    await tracked(cm).settle()
    assert len(recorder.inputs) == calls  # the "seen" mark moved with the compaction
    messages.append(user(10, "more"))
    await cm.preflight(messages, Sink())
    await tracked(cm).settle()
    assert len(recorder.inputs) == calls + 1


async def test_mig_scoring_of_a_long_history_runs_off_the_event_loop() -> None:
    class ThreadCounter(WordCounter):
        def __init__(self) -> None:
            super().__init__()
            self.threads: set[int] = set()

        def message(self, message: Message) -> int:
            self.threads.add(threading.get_ident())
            return super().message(message)

    head = [m for i in range(OFF_LOOP_BLOCKS + 1) for m in tool_turn(f"c{i}", "ls", 10)]
    counter = ThreadCounter()
    await ranked_render_async(head, [0.3] * len(head), counter, 10_000, mig=True)
    assert counter.threads == {next(iter(counter.threads))}
    assert threading.get_ident() not in counter.threads
    counter.threads.clear()
    await ranked_render_async(head[:4], [0.3] * 4, counter, 10_000, mig=True)
    assert counter.threads == {threading.get_ident()}  # short: not worth a thread


async def test_an_extraction_reply_during_compaction_waits_and_lands_on_the_right_message() -> None:
    gate = asyncio.Event()

    async def model(prompt: str) -> str:
        if prompt.startswith(SUBGOAL_PROMPT[:30]):
            return "SUBGOAL: compare the results"  # arrives while the summary is pending
        await gate.wait()
        return "the user asked for things"

    cm = ContextManager(WINDOW, WordCounter(), model, ContextSettings(strategy="subgoal"))
    messages = history(system_tokens=380)
    registry = tracked(cm).registry
    registry.sync(messages)
    registry.open("gather", 6)
    newest_step = messages[-2]  # the extraction will open the new subgoal here
    preflight = asyncio.create_task(cm.preflight(messages, Sink()))
    await tracked(cm).settle()  # the reply is in, held back: compaction is under way
    assert [s.text for s in registry.subgoals] == ["gather"]
    gate.set()
    assert await preflight == "ok"
    assert messages[1].content.startswith(SUMMARY_HEADER)
    gather, compare = registry.subgoals
    assert compare.text == "compare the results"
    assert messages[compare.start] is newest_step
    assert gather.end == compare.start
    assert messages[gather.start].role == "assistant"


async def test_nothing_to_summarise_when_the_active_subgoal_is_everything() -> None:
    recorder = Recorder()
    cm = manager(summarizer=recorder)
    messages = history(system_tokens=20)
    registry = tracked(cm).registry
    registry.sync(messages)
    registry.open("all of it", 1)
    before = list(messages)
    report = await cm.compact(messages, sink=Sink())
    assert report.before == report.after
    assert messages == before
    assert not any(p.startswith("Summarise") for p in recorder.inputs)
