"""Property: no sequence of start_focus/complete_focus calls, mixed with other tool steps,
user messages and more than one call per assistant message, leaves an invalid transcript
(docs/context.md#the-focus-strategy): every call keeps its result, the Knowledge block is
pinned after the system message and within its cap (or a single segment), and a rescan of
the result (a restart) changes nothing."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from core.context.focus import is_knowledge, segments_of
from core.context.manager import ContextManager, ContextSettings
from core.context.transcript import is_valid
from core.messages import Message, ToolCall
from tests.context import Sink, WordCounter, system, user, words

Step = tuple[str, int]
steps_st = st.lists(
    st.tuples(st.sampled_from(["start", "complete", "tool", "user", "both"]), st.integers(1, 40)),
    min_size=1,
    max_size=40,
)


async def drive(steps: list[Step], cap: int) -> tuple[list[Message], ContextManager]:
    cm = ContextManager(
        1_000_000,
        WordCounter(),
        None,
        ContextSettings.model_validate(
            {"strategy": "focus", "focus": {"max_knowledge_tokens": cap, "compression_interval": 3}}
        ),
    )
    messages = [system(20), user(10)]
    for n, (kind, size) in enumerate(steps):
        calls: list[ToolCall] = []
        if kind in ("start", "both"):
            calls.append(ToolCall(id=f"s{n}", name="start_focus", arguments='{"scope": "x"}'))
        if kind in ("tool", "both"):
            calls.append(ToolCall(id=f"t{n}", name="grep", arguments="{}"))
        if kind == "complete":
            arguments = json.dumps({"summary": words(size, f"k{n}")})
            calls.append(ToolCall(id=f"c{n}", name="complete_focus", arguments=arguments))
        if kind == "user":
            messages.append(user(size, f"u{n}"))
        else:
            messages.append(Message.assistant("", tuple(calls)))
            for c in calls:
                text = "complete_focus received" if c.name == "complete_focus" else words(size)
                messages.append(Message.tool_result(c, text))
        await cm.preflight(messages, Sink())
    return messages, cm


@settings(max_examples=150, deadline=None)
@given(steps_st, st.integers(64, 300))
def test_no_sequence_of_focus_calls_leaves_an_invalid_transcript(
    steps: list[Step], cap: int
) -> None:
    messages, cm = asyncio.run(drive(steps, cap))
    assert is_valid(messages)
    assert messages[0].role == "system"
    assert sum(is_knowledge(m) for m in messages) <= 1
    segments = segments_of(messages)
    if segments:
        assert is_knowledge(messages[1])
        assert len(segments) == 1 or WordCounter().text(messages[1].content) <= cap
    completions = sum(kind == "complete" for kind, _ in steps)
    assert len(segments) <= completions
    # A restart reads the same state back and applies nothing twice.
    again = list(messages)
    fresh = ContextManager(1_000_000, WordCounter(), None, cm.settings)
    asyncio.run(fresh.preflight(again, Sink()))
    assert [m.content for m in again[: len(messages)]] == [m.content for m in messages]
    assert fresh.focus_status(again) == cm.focus_status(messages)
