"""The Focus strategy (docs/context.md#the-focus-strategy): one test per invariant, then
durability across a restart (the store round trip) and the tools' wiring."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from bot.config import parse_config
from core.context.focus import (
    APPLIED,
    KNOWLEDGE_HEADER,
    NO_FOCUS,
    PENDING,
    REMINDER_PREFIX,
    FocusTracker,
    is_knowledge,
    segments_of,
    similar_groups,
)
from core.context.focus_tools import focus_tools
from core.context.manager import ContextManager, ContextSettings
from core.context.transcript import is_valid
from core.errors import ConfigError
from core.messages import Message, ToolCall
from core.store.sqlite import SqliteStore
from tests.context import Sink, WordCounter, system, tool_turn, user, words
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

WINDOW = 100_000


class Recorder:
    def __init__(self, text: str = "merged note") -> None:
        self.text = text
        self.inputs: list[str] = []

    async def __call__(self, prompt: str) -> str:
        self.inputs.append(prompt)
        return self.text


def manager(summarizer: Recorder | None = None, **focus: object) -> ContextManager:
    settings = ContextSettings.model_validate({"strategy": "focus", "focus": focus})
    return ContextManager(WINDOW, WordCounter(), summarizer or Recorder(), settings)


def tracker(cm: ContextManager) -> FocusTracker:
    assert cm.focus is not None
    return cm.focus


def start(call_id: str, scope: str, *also: ToolCall) -> list[Message]:
    call = ToolCall(id=call_id, name="start_focus", arguments=json.dumps({"scope": scope}))
    calls = (call, *also)
    results = [Message.tool_result(c, f"Focus started: {scope}") for c in calls]
    return [Message.assistant("", calls), *results]


def complete(call_id: str, summary: str) -> list[Message]:
    call = ToolCall(id=call_id, name="complete_focus", arguments=json.dumps({"summary": summary}))
    return [Message.assistant("", (call,)), Message.tool_result(call, f"{PENDING}; later")]


def base() -> list[Message]:
    return [system(50), user(20, "task")]


# ---- invariants ------------------------------------------------------------------------------


async def test_completion_removes_the_bracket_whole_blocks_and_keeps_the_users_words() -> None:
    cm = manager()
    grep = ToolCall(id="g0", name="grep", arguments="{}")
    messages = [
        *base(),
        *tool_turn("before", "ls", 30),  # before the focus: stays
        *start("s1", "find the config loader", grep),  # a block with another call too
        *tool_turn("x1", "grep", 50),
        user(10, "mid"),  # the user spoke during the focus: kept
        *tool_turn("x2", "read_file", 80),
        *complete("c1", "config is loaded in core/config.py by parse_config"),
    ]
    await cm.preflight(messages, Sink())
    assert is_valid(messages)
    assert is_knowledge(messages[1])
    assert "core/config.py" in messages[1].content
    assert "scope" not in messages[1].content
    assert "find the config loader" in messages[1].content
    ids = [m.tool_call_id for m in messages if m.role == "tool"]
    assert ids == ["before", "c1"]  # every call of the bracket went with its result
    assert any(m.content.startswith("mid") for m in messages)
    assert messages[-1].content.startswith(APPLIED)
    assert not any(c.name == "start_focus" for m in messages for c in m.tool_calls)
    assert cm.focus_status(messages) == (
        f"none; knowledge 1 segments, {WordCounter().text(messages[1].content)} / 4,000 tokens"
    )


async def test_a_second_start_is_refused_and_a_completion_without_focus_only_adds() -> None:
    cm = manager()
    messages = [*base(), *start("s1", "one"), *start("s2", "two")]
    await cm.preflight(messages, Sink())
    assert messages[-1].is_error
    assert "already active (one)" in messages[-1].content
    assert cm.focus_status(messages) is not None
    assert "'one'" in (cm.focus_status(messages) or "")
    messages += complete("c1", "found one")
    await cm.preflight(messages, Sink())
    messages += complete("c2", "loose note")
    await cm.preflight(messages, Sink())
    assert messages[-1].content.startswith(NO_FOCUS)
    assert [s.text for s in segments_of(messages)] == ["found one", "loose note"]
    assert is_valid(messages)


async def test_the_cap_evicts_the_oldest_segment_first_and_never_the_last() -> None:
    cm = manager(max_knowledge_tokens=64)
    messages = base()
    for n in range(3):
        messages += [*start(f"s{n}", f"scope {n}"), *complete(f"c{n}", words(25, f"k{n}"))]
        await cm.preflight(messages, Sink())
    texts = [s.text for s in segments_of(messages)]
    assert texts == [words(25, "k1"), words(25, "k2")]  # k0, the oldest, went first
    assert WordCounter().text(messages[1].content) <= 64
    messages += [*start("big", "big"), *complete("cbig", words(500, "huge"))]
    await cm.preflight(messages, Sink())
    (only,) = segments_of(messages)  # alone over the cap: kept (cut to it), never evicted
    assert only.text.startswith("huge huge")


async def test_a_reminder_after_compression_interval_steps_without_a_completed_focus() -> None:
    cm = manager(compression_interval=3)
    messages = base()
    for n in range(3):
        messages += tool_turn(f"t{n}", "grep", 10)
        await cm.preflight(messages, Sink())
    assert messages[-1].content.startswith(REMINDER_PREFIX)
    assert "without a focus" in messages[-1].content
    await cm.preflight(messages, Sink())  # no new step: no second reminder
    assert sum(m.content.startswith(REMINDER_PREFIX) for m in messages) == 1
    messages += start("s", "dig")
    for n in range(3):
        messages += tool_turn(f"d{n}", "grep", 10)
        await cm.preflight(messages, Sink())
    assert "explored 'dig' for 3 steps" in messages[-1].content
    messages += complete("c", "dug")
    await cm.preflight(messages, Sink())
    reminders = [m.content for m in messages if m.content.startswith(REMINDER_PREFIX)]
    assert len(reminders) == 1
    assert "without a focus" in reminders[0]
    assert is_valid(messages)


async def test_consolidation_waits_for_its_window_then_merges_similar_segments() -> None:
    summary = Recorder("auth lives in core/auth.py and uses tokens")
    cm = manager(summary, auto_consolidate_min_window=4, consolidate_threshold=0.5)
    messages = base()
    notes = ["auth is in core/auth.py with tokens", "auth core/auth.py uses tokens", "db is pg"]
    for n, note in enumerate(notes):
        messages += [*start(f"s{n}", f"look {n}"), *complete(f"c{n}", note)]
    focus = tracker(cm)
    for _turn in range(3):
        cm.start_turn()
        await cm.preflight(messages, Sink())
        await focus.settle()
    assert summary.inputs == []  # the window has not elapsed: no-op
    summary_calls = len(summary.inputs)
    cm.start_turn()
    await cm.preflight(messages, Sink())  # starts the pass; never awaited by the step
    await focus.settle()
    assert len(summary.inputs) == summary_calls + 1  # one call for the similar pair
    assert "auth is in core/auth.py" in summary.inputs[0]
    assert "db is pg" not in summary.inputs[0]
    messages += tool_turn("next", "ls", 5)
    await cm.preflight(messages, Sink())  # the merge goes in at the next step
    assert [s.text for s in segments_of(messages)] == [summary.text, "db is pg"]  # in place
    assert segments_of(messages)[0].scope == "look 0 + look 1"
    assert focus.consolidations == 1
    cm.start_turn()
    await cm.preflight(messages, Sink())
    await focus.settle()
    assert len(summary.inputs) == 1  # the window starts again after a pass
    assert is_valid(messages)


async def test_the_pairwise_scoring_runs_in_a_worker_thread() -> None:
    cm = manager(auto_consolidate_min_window=1)
    focus = tracker(cm)
    threads: list[int] = []

    def scoring(texts: list[str], threshold: float) -> list[list[int]]:
        threads.append(threading.get_ident())
        return similar_groups(texts, threshold)

    focus.score = scoring
    messages = [*base(), *start("a", "a"), *complete("ca", "x y z"), *start("b", "b")]
    messages += complete("cb", "x y z")
    cm.start_turn()
    await cm.preflight(messages, Sink())
    await focus.settle()
    assert threads
    assert threading.get_ident() not in threads


def _raw(context: dict[str, object]) -> dict[str, object]:
    return {
        "default_provider": "p",
        "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
        "context": context,
    }


def test_a_window_of_zero_is_rejected_at_start_up_naming_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw({"strategy": "focus", "focus": {"auto_consolidate_min_window": 0}}))
    assert caught.value.key == "context.focus.auto_consolidate_min_window"
    assert "every completed focus" in str(caught.value)
    assert parse_config(_raw({"strategy": "focus"})).context.focus.auto_consolidate_min_window == 4


@pytest.mark.parametrize("strategy", ["subgoal", "subgoal_mig"])
def test_focus_and_the_subgoal_strategies_are_mutually_exclusive(strategy: str) -> None:
    raw = _raw({"strategy": strategy, "focus": {"max_knowledge_tokens": 1000}})
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert "context.focus" in str(caught.value)
    assert "context.strategy" in str(caught.value)
    assert "mutually exclusive" in str(caught.value)


async def test_focus_state_survives_a_restart_and_clear_resets_it(tmp_path: Path) -> None:
    """The state is the transcript: saved, loaded by a new process (a new manager), the
    active focus and the Knowledge block are still there, and a completion made before the
    restart is not applied twice."""
    cm = manager()
    messages = [*base(), *start("s1", "first"), *complete("c1", "first found")]
    await cm.preflight(messages, Sink())
    messages += [*start("s2", "second"), *tool_turn("t", "grep", 30)]
    await cm.preflight(messages, Sink())
    store = await SqliteStore.open(tmp_path / "parley.db")
    try:
        store.save_messages("conv", messages)
        await store.flush()
    finally:
        await store.aclose()
    store = await SqliteStore.open(tmp_path / "parley.db")
    try:
        loaded = await store.load_messages("conv")
    finally:
        await store.aclose()
    after = manager()
    assert after.focus_status(loaded) == cm.focus_status(messages)
    assert "'second'" in (after.focus_status(loaded) or "")
    await after.preflight(loaded, Sink())
    assert [s.text for s in segments_of(loaded)] == ["first found"]  # not applied twice
    loaded += complete("c2", "second found")
    await after.preflight(loaded, Sink())
    assert [s.text for s in segments_of(loaded)] == ["first found", "second found"]
    assert not any(m.tool_call_id == "t" for m in loaded)
    loaded.clear()  # /clear empties the history: the focus goes with it
    assert after.focus_status(loaded) == "none; knowledge 0 segments, 0 / 4,000 tokens"
    loaded += [*base(), *complete("c3", "fresh")]
    await after.preflight(loaded, Sink())
    assert [s.text for s in segments_of(loaded)] == ["fresh"]


async def test_compaction_keeps_the_knowledge_block_and_the_active_focus() -> None:
    cm = ContextManager(
        2000,
        WordCounter(),
        Recorder("older work"),
        ContextSettings.model_validate({"strategy": "focus", "keep_tail": 2}),
    )
    messages = [*base(), *start("s0", "done"), *complete("c0", "known fact")]
    messages += [m for i in range(12) for m in tool_turn(f"o{i}", "ls", 100)]
    messages += [*start("s1", "live"), *tool_turn("l1", "grep", 100), *tool_turn("l2", "cat", 100)]
    await cm.preflight(messages, Sink())
    assert cm.last_compaction is not None
    assert is_knowledge(messages[1])
    assert "known fact" in messages[1].content
    assert any(c.id == "s1" for m in messages for c in m.tool_calls)  # the focus is intact
    assert "'live'" in (cm.focus_status(messages) or "")
    assert is_valid(messages)


def test_the_tools_are_offered_only_under_the_focus_strategy() -> None:
    from bot.app import build_registry

    focus = parse_config(_raw({"strategy": "focus"}))
    summary = parse_config(_raw({"strategy": "summary"}))
    names = {t.name for t in focus_tools()}
    assert names <= set(build_registry(focus, {}).names())
    assert not names & set(build_registry(summary, {}).names())


def test_knowledge_header_is_stable() -> None:
    """The header is how a restarted process finds the block: changing it orphans blocks."""
    assert KNOWLEDGE_HEADER == "[Knowledge: what completed focus sessions found]"


async def test_consolidation_never_blocks_the_step() -> None:
    gate = asyncio.Event()

    async def slow(prompt: str) -> str:
        await gate.wait()
        return "merged"

    cm = ContextManager(
        WINDOW,
        WordCounter(),
        slow,
        ContextSettings.model_validate(
            {"strategy": "focus", "focus": {"auto_consolidate_min_window": 1}}
        ),
    )
    messages = [*base(), *start("a", "a"), *complete("ca", "same words"), *start("b", "b")]
    messages += complete("cb", "same words")
    cm.start_turn()
    await cm.preflight(messages, Sink())  # returns although the summary call hangs
    messages += tool_turn("t", "ls", 5)
    await cm.preflight(messages, Sink())
    gate.set()
    await tracker(cm).settle()
    await cm.preflight(messages, Sink())
    assert [s.text for s in segments_of(messages)] == ["merged"]


async def test_the_real_loop_runs_the_tools_and_the_next_request_has_the_knowledge() -> None:
    """The tools through the executor and the loop: after complete_focus the next request
    carries the Knowledge block and none of the exploration."""
    from core.loop import Guards, run_loop
    from core.providers.scripted import ScriptedProvider, ScriptedReply, tool_call
    from core.sandbox.settings import SandboxSettings
    from core.tools.base import ToolContext, ToolRegistry
    from core.tools.executor import ToolExecutor
    from core.tools.policy import ToolPolicy
    from tests.helpers import EchoTool

    cm = manager()
    main = ScriptedProvider(
        [
            ScriptedReply(tool_calls=[tool_call("start_focus", {"scope": "echo twice"})]),
            ScriptedReply(tool_calls=[tool_call("echo", {"text": "first secret"})]),
            ScriptedReply(tool_calls=[tool_call("echo", {"text": "second secret"})]),
            ScriptedReply(tool_calls=[tool_call("complete_focus", {"summary": "echo works"})]),
            ScriptedReply("done"),
        ]
    )
    registry = ToolRegistry([EchoTool(), *focus_tools()])
    tools = ToolExecutor(registry, ToolPolicy(), ToolContext(SandboxSettings()))
    messages = [Message.system("You are a test."), Message.user("echo, twice")]
    outcome = await run_loop(messages, main, tools, guards=Guards(context=cm))
    assert outcome.text == "done"
    last = main.requests[-1].messages
    assert is_knowledge(last[1])
    assert "echo works" in last[1].content
    assert not any("secret" in m.content for m in last)
    assert is_valid(list(last))
    assert cm.last_compaction is not None
    assert cm.last_compaction.kind == "focus"


async def test_the_agent_s_status_shows_the_focus_across_a_restart_and_clear_resets_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from tests.agentkit import RecordingResponder, inbound, running_agent

    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("start_focus", {"scope": "the flaky test"})]),
        Reply(text="looking"),
    )
    context = {"strategy": "focus"}
    async with running_agent(fake_llm, tmp_path, context=context) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("why is it flaky?"), chat)
        await agent.wait_idle()
        assert "start_focus" in [t["function"]["name"] for t in fake_llm.requests[0].json["tools"]]
    async with running_agent(fake_llm, tmp_path, context=context) as agent:  # a new process
        chat = RecordingResponder()
        await agent.submit(inbound("/status"), chat)
        status = await chat.wait_sent("Focus:")
        assert "Focus: 'the flaky test'; knowledge 0 segments" in status
        await agent.submit(inbound("/clear"), chat)
        await agent.submit(inbound("/status"), chat)
        await chat.wait_sent("Cleared")
        chat.sent.clear()
        await agent.submit(inbound("/status"), chat)
        status = await chat.wait_sent("Focus:")
        assert "Focus: none; knowledge 0 segments" in status
