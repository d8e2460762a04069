"""Transcript repair, and the property that repair and compaction keep a history valid."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from core.context.manager import ContextManager, ContextSettings
from core.context.transcript import MISSING_RESULT, is_valid, pinned_results, repair_transcript
from core.errors import ContextLimitExceeded
from core.events import discard
from core.messages import Message, ToolCall
from tests.context import WordCounter

A = ToolCall(id="a", name="search")
B = ToolCall(id="b", name="read")


def test_valid_history_comes_back_unchanged() -> None:
    history = [
        Message.system("sys"),
        Message.user("hi"),
        Message.assistant("", (A, B)),
        Message.tool_result(B, "2"),  # any order inside the block is fine
        Message.tool_result(A, "1"),
        Message.assistant("done"),
    ]
    repair = repair_transcript(history)
    assert is_valid(history)
    assert (repair.synthesized, repair.dropped, repair.changed) == (0, 0, False)
    assert all(x is y for x, y in zip(repair.messages, history, strict=True))


def test_missing_duplicate_and_orphaned_results() -> None:
    history = [
        Message.user("hi"),
        Message.tool_result(B, "orphan before any call"),
        Message.assistant("", (A, B)),
        Message.tool_result(A, "1"),
        Message.tool_result(A, "1 again"),
        Message.user("next"),
        Message.tool_result(A, "late: not in the block after its call"),
        Message.assistant(""),
    ]
    repair = repair_transcript(history)
    out = repair.messages
    assert [m.role for m in out] == ["user", "assistant", "tool", "tool", "user"]
    assert out[2].content == "1"
    assert (out[3].tool_call_id, out[3].content, out[3].is_error) == ("b", MISSING_RESULT, True)
    assert (repair.synthesized, repair.dropped) == (1, 4)
    assert is_valid(out)
    assert not is_valid(history)


def test_system_moves_first_and_duplicate_call_ids_are_merged() -> None:
    history = [
        Message.user("hi"),
        Message.system("sys"),
        Message.assistant("x", (A, A)),
        Message.tool_result(A, "1"),
    ]
    out = repair_transcript(history).messages
    assert out[0].role == "system"
    assert out[2].tool_calls == (A,)
    assert is_valid(out)


def test_interrupted_call_at_the_end_gets_a_result() -> None:
    out = repair_transcript([Message.user("go"), Message.assistant("", (A,))]).messages
    assert out[-1].tool_call_id == "a"
    assert out[-1].is_error


def test_pins_latest_success_per_tool_newest_first() -> None:
    c = ToolCall(id="c", name="fetch")
    head = [
        Message.tool_result(A, "old hit"),
        Message.tool_result(c, "page"),
        Message.tool_result(A, "new hit"),
        Message.tool_result(A, "boom", is_error=True),
        Message.tool_result(c, "Error executing fetch"),
    ]
    assert pinned_results(head, each=100, budget=1000) == [
        "[Latest result of each tool, pinned]",
        "### search\nnew hit",
        "### fetch\npage",
    ]
    assert pinned_results([], each=100, budget=1000) == []


# ---- property: over random histories -------------------------------------------------------

IDS = st.sampled_from(["c1", "c2", "c3", "c4", "c5"])
TEXT = st.text(alphabet="abc xyz", min_size=0, max_size=30)


@st.composite
def items(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "calls", "result", "result", "empty"]))
    if kind == "user":
        return Message.user(draw(TEXT) + "!")  # non-empty, and distinguishable
    if kind == "assistant":
        return Message.assistant(draw(TEXT))
    if kind == "empty":
        return Message.assistant("")
    if kind == "calls":
        ids = draw(st.lists(IDS, min_size=0, max_size=3))
        calls = tuple(ToolCall(id=i, name=draw(st.sampled_from(["ls", "cat"]))) for i in ids)
        return Message.assistant(draw(TEXT), calls)
    call = ToolCall(id=draw(IDS), name="ls")
    return Message.tool_result(call, draw(TEXT) * 20, is_error=draw(st.booleans()))


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    history = draw(st.lists(items(), min_size=0, max_size=40))
    if draw(st.booleans()):
        history.insert(draw(st.integers(0, len(history))), Message.system("sys"))
    return history


def latest_user(history: list[Message]) -> Message | None:
    return next((m for m in reversed(history) if m.role == "user"), None)


def check(after: list[Message], before: list[Message]) -> None:
    assert is_valid(after)
    if any(m.role == "system" for m in before):
        assert after[0].role == "system"
    wanted = latest_user(before)
    if wanted is not None:
        assert any(m is wanted for m in after)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_repair_makes_any_history_valid_and_is_idempotent(history: list[Message]) -> None:
    repair = repair_transcript(history)
    check(repair.messages, history)
    again = repair_transcript(repair.messages)
    assert not again.changed
    assert all(x is y for x, y in zip(again.messages, repair.messages, strict=True))


@settings(max_examples=150, deadline=None)
@given(histories(), st.integers(1, 12), st.integers(1, 4), st.booleans())
def test_compaction_keeps_any_history_valid(
    history: list[Message], keep_tail: int, deep_keep: int, manual: bool
) -> None:
    config = ContextSettings(keep_tail=keep_tail, deep_keep=deep_keep, max_recoveries=2)
    # A tiny window puts most histories over every threshold.
    manager = ContextManager(20, WordCounter(), None, config, session="cron")
    messages = list(history)

    async def run() -> None:
        if manual:
            await manager.compact(messages, sink=discard)
        else:
            # The hard limit may still be hit (a huge latest request); that is allowed.
            with contextlib.suppress(ContextLimitExceeded):
                await manager.preflight(messages, discard)

    asyncio.run(run())
    check(messages, history)
