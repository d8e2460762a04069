"""Property: whatever the history, the budget and the compaction path (pre-flight ladder or
`/compact`, either subgoal strategy), no message of the active subgoal is dropped, they stay
the history's tail in order, the registry still points at them, and every tool call keeps
its results (the history stays valid for every provider)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from core.context.manager import ContextManager, ContextSettings
from core.context.transcript import is_valid
from core.errors import ContextLimitExceeded
from core.messages import Message, ToolCall
from tests.context import Sink, WordCounter, reply, system, user, words

Block = tuple[str, list[int]]
blocks_st = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.lists(st.integers(5, 60), min_size=1, max_size=1)),
        st.tuples(st.just("reply"), st.lists(st.integers(5, 60), min_size=1, max_size=1)),
        st.tuples(st.just("tools"), st.lists(st.integers(5, 200), min_size=1, max_size=3)),
    ),
    min_size=2,
    max_size=30,
)


def build(blocks: list[Block]) -> tuple[list[Message], list[int]]:
    """The history and the index where each block starts."""
    messages = [system(40)]
    starts: list[int] = []
    for n, (kind, sizes) in enumerate(blocks):
        starts.append(len(messages))
        if kind == "user":
            messages.append(user(sizes[0], f"u{n}"))
        elif kind == "reply":
            messages.append(reply(sizes[0], f"a{n}"))
        else:
            calls = tuple(ToolCall(id=f"c{n}_{k}", name="grep") for k in range(len(sizes)))
            messages.append(Message.assistant("", calls))
            messages += [
                Message.tool_result(c, words(s, f"r{n}")) for c, s in zip(calls, sizes, strict=True)
            ]
    return messages, starts


def key(m: Message) -> tuple[object, ...]:
    """What must survive: the message itself, except that R2 may mask a tool output."""
    if m.role == "tool":
        return ("tool", m.tool_call_id)
    return (m.role, m.content, tuple(c.id for c in m.tool_calls))


async def compact_once(
    messages: list[Message],
    active: int,
    completed: int | None,
    window: int,
    manual: bool,
    mig: bool,
) -> ContextManager:
    async def summarizer(prompt: str) -> str:
        return "the user asked for things"

    strategy = "subgoal_mig" if mig else "subgoal"
    cm = ContextManager(
        window, WordCounter(), summarizer, ContextSettings(strategy=strategy, keep_tail=4)
    )
    assert cm.subgoals is not None
    registry = cm.subgoals.registry
    registry.sync(messages)
    if completed is not None:
        registry.open("earlier", completed)
    registry.open("now", active)
    try:
        if manual:
            await cm.compact(messages, sink=Sink())
        else:
            for _ in range(3):  # the ladder: R1, R2, then R3 asks
                if await cm.preflight(messages, Sink()) != "ok":
                    break
    except ContextLimitExceeded:
        pass  # the active span alone is too big: the turn fails, nothing is dropped
    await cm.aclose()
    return cm


@settings(max_examples=150, deadline=None)
@given(
    blocks=blocks_st,
    active_at=st.integers(0, 29),
    completed_at=st.one_of(st.none(), st.integers(0, 29)),
    window=st.integers(300, 3000),
    manual=st.booleans(),
    mig=st.booleans(),
)
def test_compaction_never_drops_an_active_subgoal_message(
    blocks: list[Block],
    active_at: int,
    completed_at: int | None,
    window: int,
    manual: bool,
    mig: bool,
) -> None:
    messages, starts = build(blocks)
    active = starts[min(active_at, len(starts) - 1)]
    completed = None
    if completed_at is not None and starts[min(completed_at, len(starts) - 1)] < active:
        completed = starts[min(completed_at, len(starts) - 1)]
    wanted = [key(m) for m in messages[active:]]
    cm = asyncio.run(compact_once(messages, active, completed, window, manual, mig))
    assert is_valid(messages)
    assert [key(m) for m in messages[len(messages) - len(wanted) :]] == wanted
    assert cm.subgoals is not None
    assert cm.subgoals.registry.active_start() == len(messages) - len(wanted)
