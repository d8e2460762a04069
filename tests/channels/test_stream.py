"""The reply streamer, edit budget, typing indicator and plain delivery (channels/stream.py),
against an in-test surface that records every call; time is a FakeClock."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from channels.stream import EditBudget, ReplyStreamer, Typing, deliver
from channels.text import split_message
from core.errors import ChannelRateLimited, ChannelUnavailable, DeliveryFailed
from core.events import Notice, StreamRestarted, TextDelta, ToolFinished, ToolStarted
from core.messages import Message, ToolCall
from tests.fakes.clock import FakeClock


class Rejected(Exception):
    """A permanent refusal (the platform could not parse the markup, no such message)."""


@dataclass(frozen=True)
class Call:
    op: str
    message_id: str
    text: str
    final: bool
    at: float
    error: str = ""


@dataclass
class Plan:
    op: str
    make: Callable[[], Exception]
    times: int
    final: bool | None


class RecordingSurface:
    """A chat surface that keeps the visible messages and records every attempted call;
    it can be told to fail calls with a given exception."""

    def __init__(self, clock: FakeClock, *, limit: int = 4096) -> None:
        self.clock = clock
        self.limit = limit
        self.attempts: list[Call] = []
        self.messages: dict[str, str] = {}
        self.plans: list[Plan] = []
        self.reject_markup = False
        self.hold: asyncio.Event | None = None
        self._next_id = 1

    def measure(self, text: str) -> int:
        return len(text)

    @property
    def calls(self) -> list[Call]:
        return [call for call in self.attempts if not call.error]

    def fail(
        self,
        op: str,
        make: Callable[[], Exception],
        *,
        times: int = 1,
        final: bool | None = None,
    ) -> None:
        self.plans.append(Plan(op, make, times, final))

    def _attempt(self, op: str, message_id: str, text: str, final: bool) -> None:
        error: Exception | None = None
        for plan in self.plans:
            if plan.times and plan.op in (op, "any") and plan.final in (None, final):
                plan.times -= 1
                error = plan.make()
                break
        if error is None and final and self.reject_markup:
            error = Rejected("can't parse entities")
        if error is None and op != "post" and message_id not in self.messages:
            error = Rejected("message not found")
        name = type(error).__name__ if error else ""
        self.attempts.append(Call(op, message_id, text, final, self.clock.now, name))
        if error is not None:
            raise error

    async def post(self, text: str, *, final: bool) -> str:
        if self.hold is not None:
            await self.hold.wait()
        assert text.strip()
        assert len(text) <= self.limit
        message_id = f"m{self._next_id}"
        self._attempt("post", message_id, text, final)
        self._next_id += 1
        self.messages[message_id] = text
        return message_id

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        assert text.strip()
        assert len(text) <= self.limit
        self._attempt("edit", message_id, text, final)
        self.messages[message_id] = text

    async def delete(self, message_id: str) -> None:
        self._attempt("delete", message_id, "", False)
        del self.messages[message_id]


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the event loop run until `condition` holds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0)


async def settle() -> None:
    """Let the streamer's background task run (its FakeClock sleeps return at once)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def stream_chunks(
    streamer: ReplyStreamer, clock: FakeClock, chunks: list[str], per_batch: int = 3
) -> str:
    text = ""
    for i, chunk in enumerate(chunks):
        streamer(TextDelta(chunk))
        text += chunk
        if i % per_batch == per_batch - 1:
            clock.now += 0.2
            await settle()
    await settle()
    return text


def assert_interval(calls: list[Call], min_interval: float) -> None:
    """No message is touched twice within `min_interval` (FakeClock time)."""
    by_message: dict[str, list[float]] = {}
    for call in calls:
        by_message.setdefault(call.message_id, []).append(call.at)
    for times in by_message.values():
        assert all(b - a >= min_interval - 1e-9 for a, b in itertools.pairwise(times)), times


async def test_one_post_then_throttled_edits_then_final_text() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    chunks = [f"word{i} " for i in range(30)]
    text = await stream_chunks(streamer, clock, chunks)
    full = text + "**done**"
    await streamer.finish(full)

    calls = surface.calls
    assert calls[0].op == "post"
    assert not calls[0].final
    assert all(c.op == "edit" and c.message_id == "m1" for c in calls[1:])
    assert [c.text for c in calls[:2]] == ["word0 word1 word2 ", text[: len(calls[1].text)]]
    assert len(calls) >= 3  # post, ≥ 1 intermediate edit, final edit
    assert len(calls) <= len(chunks) // 3 + 2  # deltas between edits are coalesced
    assert all(not c.final for c in calls[:-1])
    assert calls[-1] == Call("edit", "m1", full, True, calls[-1].at)
    assert_interval(calls, 1.0)
    assert surface.messages == {"m1": full}


async def test_edits_that_change_nothing_are_skipped() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    streamer(TextDelta("Hello"))
    await until(lambda: len(surface.calls) == 1)
    for event in (TextDelta(""), TextDelta("  "), Notice("tool ran"), TextDelta("\n")):
        streamer(event)
        clock.now += 5
        await settle()
    assert len(surface.calls) == 1
    await streamer.finish("Hello")
    assert [(c.op, c.text, c.final) for c in surface.calls] == [
        ("post", "Hello", False),
        ("edit", "Hello", True),  # same text, but now formatted as final
    ]
    again = ReplyStreamer(surface, clock=clock)
    await again.finish("Hello")  # nothing streamed: one final post
    assert surface.calls[-1] == Call("post", "m2", "Hello", True, clock.now)


async def test_long_stream_continues_in_new_messages() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=60)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    chunks = [f"line {i} of the answer\n" for i in range(20)]
    full = await stream_chunks(streamer, clock, chunks, per_batch=2)
    posts_while_streaming = [c for c in surface.calls if c.op == "post"]
    assert len(posts_while_streaming) > 1
    # Messages other than the last were completed (final) while the stream went on.
    first_final = [c for c in surface.calls if c.message_id == "m1" and c.final]
    assert first_final
    await streamer.finish(full)

    expected = split_message(full, 60)
    assert list(surface.messages.values()) == expected
    assert list(surface.messages) == [f"m{i}" for i in range(1, len(expected) + 1)]
    assert streamer.message_ids == list(surface.messages)
    assert all(len(c.text) <= 60 for c in surface.calls)
    # A message already showing its final piece is not edited again.
    assert len([c for c in surface.calls if c.message_id == "m1" and c.final]) == 1
    assert_interval(surface.calls, 1.0)


async def test_rate_limit_is_waited_out_and_final_text_arrives() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    surface.fail("edit", lambda: ChannelRateLimited(7.0), final=False)
    surface.fail("edit", lambda: ChannelRateLimited(3.0), final=True)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    text = await stream_chunks(streamer, clock, [f"part {i}. " for i in range(12)])
    await streamer.finish(text + "end")

    limited = [c for c in surface.attempts if c.error == "ChannelRateLimited"]
    assert [c.final for c in limited] == [False, True]
    for call, wait in zip(limited, (7.0, 3.0), strict=True):
        after = surface.attempts[surface.attempts.index(call) + 1 :]
        assert after
        assert all(c.at >= call.at + wait - 1e-9 for c in after), (call, after)
    assert 7.0 in clock.sleeps
    assert 3.0 in clock.sleeps
    assert surface.calls[-1].final
    assert surface.messages == {"m1": text + "end"}


async def test_transient_errors_are_retried_with_backoff() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    surface.fail("edit", lambda: ChannelUnavailable("502"), final=False)  # intermediate: dropped
    surface.fail("edit", lambda: ChannelUnavailable("503"), times=3, final=True)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    text = await stream_chunks(streamer, clock, [f"part {i}. " for i in range(9)])
    clock.sleeps.clear()
    await streamer.finish(text)
    backoffs = [s for s in clock.sleeps if s in (0.5, 1.0, 2.0, 4.0)]
    assert backoffs[-3:] == [0.5, 1.0, 2.0]
    assert [c.error for c in surface.attempts if c.final] == ["ChannelUnavailable"] * 3 + [""]
    assert surface.messages == {"m1": text}


async def test_transient_errors_that_persist_raise_delivery_failed() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    surface.fail("post", lambda: ChannelUnavailable("503"), times=99)
    streamer = ReplyStreamer(surface, clock=clock)
    with pytest.raises(DeliveryFailed):
        await streamer.finish("The answer.")
    assert len(surface.attempts) == 5
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0]


async def test_permanent_failure_of_the_final_text_raises_delivery_error() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=1.0)
    text = await stream_chunks(streamer, clock, ["Some ", "partial ", "text"])
    assert surface.messages
    surface.fail("any", lambda: Rejected("forbidden"), times=99)
    with pytest.raises(DeliveryFailed):
        await streamer.finish(text + ", finished")
    # Formatted and plain edit, then a formatted and a plain new post: all refused.
    tried = [(c.op, c.final) for c in surface.attempts if c.error == "Rejected"]
    assert tried == [
        ("edit", True),
        ("edit", False),
        ("delete", False),
        ("post", True),
        ("post", False),
    ]


async def test_rejected_markup_falls_back_to_plain_text() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    surface.reject_markup = True
    streamer = ReplyStreamer(surface, clock=clock)
    text = await stream_chunks(streamer, clock, ["Use ", "**this**", " <tag>"])
    await streamer.finish(text)
    assert surface.calls[-1] == Call("edit", "m1", text, False, surface.calls[-1].at)
    assert surface.messages == {"m1": text}


async def test_uneditable_message_is_replaced_by_a_new_post() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock)
    text = await stream_chunks(streamer, clock, ["Some ", "text"])
    surface.messages.clear()  # someone deleted the message
    await streamer.finish(text + "!")
    assert list(surface.messages.values()) == [text + "!"]
    assert surface.calls[-1].op == "post"
    assert surface.calls[-1].final


async def test_silent_reply_posts_nothing() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock)
    await stream_chunks(streamer, clock, ["[SIL", "ENT", "]"], per_batch=1)
    await streamer.finish("[SILENT]")
    assert surface.attempts == []


async def test_silent_finish_deletes_a_posted_placeholder() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock)
    await stream_chunks(streamer, clock, ["Let me check", "…"])
    assert surface.messages
    await streamer.finish("NO_REPLY")
    assert surface.messages == {}
    assert surface.calls[-1].op == "delete"
    empty = ReplyStreamer(surface, clock=clock)
    await empty.finish("   ")
    assert surface.calls[-1].op == "delete"


def steps(name: str) -> tuple[ToolStarted, ToolFinished]:
    call = ToolCall("c1", name)
    return ToolStarted(call, "read"), ToolFinished(call, Message.tool_result(call, "ok"), 0.01)


async def test_a_status_alone_is_posted_kept_and_turned_into_the_answer() -> None:
    """`status_alone` (Discord): a run that starts with a tool step shows the step as a
    message of its own, keeps it through the step's end (no blank message, no churn), and
    that message becomes the answer; without it a status alone posts nothing."""
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock, status_lines=True, status_alone=True)
    started, finished = steps("bash")
    streamer(started)
    await until(lambda: len(surface.calls) == 1)
    streamer(finished)
    clock.now += 5
    await settle()
    assert surface.messages == {"m1": "⚙️ running `bash`…"}  # kept while the model thinks
    streamer(TextDelta("NO_"))  # could still become the silent marker: the step stays alone
    clock.now += 5
    await settle()
    streamer(TextDelta("w it is done."))
    clock.now += 5
    await until(lambda: surface.messages == {"m1": "NO_w it is done."})
    await streamer.finish("NO_w it is done.")
    assert [c.op for c in surface.calls] == ["post", "edit", "edit"]
    assert surface.messages == {"m1": "NO_w it is done."}

    plain = ReplyStreamer(surface, clock=clock, status_lines=True)
    plain(started)
    clock.now += 5
    await settle()
    assert len(surface.calls) == 3  # no message for a status alone
    await plain.finish("done")


async def test_a_silent_answer_after_a_status_alone_leaves_nothing() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock, status_lines=True, status_alone=True)
    streamer(steps("bash")[0])
    await until(lambda: len(surface.calls) == 1)
    await streamer.finish("NO_REPLY")
    assert [c.op for c in surface.calls] == ["post", "delete"]
    assert surface.messages == {}


async def test_discarded_attempt_is_replaced() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    streamer = ReplyStreamer(surface, clock=clock)
    await stream_chunks(streamer, clock, ["A first ", "attempt"])
    streamer(StreamRestarted(attempt=1, reason="503", delay=1.0, discard=True))
    text = await stream_chunks(streamer, clock, ["Second ", "try"])
    assert surface.messages == {"m1": "Second try"}
    await streamer.finish(text)
    assert surface.messages == {"m1": "Second try"}


async def test_finish_waits_for_a_post_in_flight() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock)
    surface.hold = asyncio.Event()
    streamer = ReplyStreamer(surface, clock=clock)
    streamer(TextDelta("Hello"))
    await settle()
    finishing = asyncio.create_task(streamer.finish("Hello there"))
    await settle()
    assert surface.attempts == []
    assert not finishing.done()
    surface.hold.set()
    await finishing
    assert [(c.op, c.final) for c in surface.calls] == [("post", False), ("edit", True)]
    assert surface.messages == {"m1": "Hello there"}


async def test_the_first_preview_waits_for_before_preview_which_is_awaited_once() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=20)
    streamer = ReplyStreamer(surface, clock=clock)
    committed = asyncio.Event()
    waits: list[int] = []

    async def before_preview() -> None:  # the agent commits the run's start here
        waits.append(len(surface.attempts))
        await committed.wait()

    streamer.before_preview = before_preview
    streamer(TextDelta("Hello"))
    await settle()
    assert surface.attempts == []  # nothing shows before the commit
    committed.set()
    await stream_chunks(streamer, clock, [f"chunk {i} " for i in range(8)], per_batch=1)
    assert len([c for c in surface.calls if c.op == "post"]) >= 2  # the later posts pay nothing
    await streamer.finish("done")
    assert waits == [0]


async def test_typing_callback_after_each_intermediate_post_and_aclose() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=20)
    typed: list[float] = []

    async def typing() -> None:
        typed.append(clock.now)
        raise RuntimeError("typing is best effort")

    streamer = ReplyStreamer(surface, clock=clock, typing=typing)
    await stream_chunks(streamer, clock, [f"chunk {i} " for i in range(8)], per_batch=1)
    posts = [c for c in surface.calls if c.op == "post"]
    assert len(posts) >= 2
    assert len(typed) == len(posts)
    await streamer.aclose()
    streamer(TextDelta("ignored after close"))
    await settle()
    assert all("ignored" not in c.text for c in surface.attempts)


async def test_edit_budget_keeps_calls_within_the_window() -> None:
    clock = FakeClock()
    budget = EditBudget(5, 5.0, clock)
    times = []
    for _ in range(17):
        await budget.acquire()
        times.append(clock.now)
        budget.landed()  # the platform answered at once
    assert times[:5] == [0.0] * 5
    assert all(times[i + 5] - times[i] >= 5.0 - 1e-9 for i in range(len(times) - 5))


async def test_edit_budget_counts_a_call_from_when_its_answer_came_back() -> None:
    clock = FakeClock()
    budget = EditBudget(1, 5.0, clock)
    await budget.acquire()
    waiting = asyncio.ensure_future(budget.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()  # in flight: the slot is held however long it takes
    clock.now = 3.0
    budget.landed()  # the platform counted it somewhere in [0, 3]
    await waiting
    assert clock.now >= 8.0


async def test_streamer_respects_a_shared_edit_budget() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=30)
    budget = EditBudget(2, 5.0, clock)
    streamer = ReplyStreamer(surface, clock=clock, min_interval=0.5, budget=budget)
    text = await stream_chunks(streamer, clock, [f"bit {i} " for i in range(30)], per_batch=2)
    await streamer.finish(text)
    times = [c.at for c in surface.calls]
    assert all(times[i + 2] - times[i] >= 5.0 - 1e-9 for i in range(len(times) - 2))
    assert list(surface.messages.values()) == split_message(text, 30)


async def test_typing_repeats_and_stops_on_exit() -> None:
    clock = FakeClock()
    sent: list[float] = []

    async def send() -> None:
        sent.append(clock.now)
        if len(sent) == 2:
            raise ConnectionError("ignored")

    typing = Typing(send, interval=4.0, clock=clock)
    async with typing:
        await until(lambda: len(sent) >= 4)
        assert typing.running
    count = len(sent)
    await settle()
    assert len(sent) == count
    assert not typing.running
    assert sent[:4] == [0.0, 4.0, 8.0, 12.0]


async def test_typing_stops_when_cancelled() -> None:
    clock = FakeClock()
    sent: list[float] = []

    async def send() -> None:
        sent.append(clock.now)

    typing = Typing(send, interval=4.0, clock=clock)

    async def run() -> None:
        async with typing:
            await asyncio.Event().wait()

    task = asyncio.create_task(run())
    await until(lambda: len(sent) >= 2)
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    assert not typing.running
    count = len(sent)
    await settle()
    assert len(sent) == count


async def test_deliver_posts_split_final_text() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=40)
    text = "\n".join(f"row {i}: some value" for i in range(10))
    ids = await deliver(surface, text, clock=clock)
    assert ids == list(surface.messages)
    assert list(surface.messages.values()) == split_message(text, 40)
    assert all(c.op == "post" and c.final for c in surface.calls)
    assert await deliver(surface, "[SILENT]", clock=clock) == []
    surface.fail("post", lambda: ChannelRateLimited(2.0))
    assert len(await deliver(surface, "after a 429", clock=clock)) == 1
    assert 2.0 in clock.sleeps
    surface.fail("post", lambda: Rejected("channel not found"), times=2)
    with pytest.raises(DeliveryFailed):
        await deliver(surface, "refused", clock=clock)


async def test_a_failed_delete_of_a_discarded_message_is_retried_at_finish() -> None:
    clock = FakeClock()
    surface = RecordingSurface(clock, limit=20)
    streamer = ReplyStreamer(surface, clock=clock)
    await stream_chunks(streamer, clock, ["aaaa bbbb ", "cccc dddd ", "eeee ffff ", "gggg"])
    assert len(surface.messages) == 2  # the first attempt spilled into a second message
    surface.fail("delete", lambda: ChannelUnavailable("502"))
    streamer(StreamRestarted(attempt=1, reason="503", delay=1.0, discard=True))
    text = await stream_chunks(streamer, clock, ["short"])
    await streamer.finish(text)
    assert surface.messages == {"m1": "short"}  # the stale second message is gone
