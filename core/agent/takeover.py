"""What a worker does with a run it took over from a dead (or frozen) one.

The run is this worker's and still `running` in the store, so nothing else of its
conversation runs meanwhile: a message queued behind it never overtakes it. Its previews
in the chat are retracted first ("the answer continues below"), then:

- if it ended (its final checkpoint is stored) its answer is posted: it is never
  announced as interrupted;
- if it can safely go on — every side-effecting call it started had finished — it is
  resumed here, at once, with this worker's configuration (as its conversation's next turn
  would be): the user sees one answer, below the retracted preview, and no notice;
- otherwise the conversation pauses: the run waits (`waiting_on_human`, resumable), the
  notice says why, and the messages behind it wait until someone answers `/resume` (go on
  anyway: the unfinished call is not run again, the model is told it may or may not have
  taken effect) or `/skip` (drop it and go on).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any, Protocol

from core.agent.conversation import Conversation
from core.agent.lane import Lane, RunReport
from core.agent.recovery import RecoveryHost, parse_conv, retract_previews, take_over
from core.agent.responders import safe_send
from core.agent.runs import reopen_calls, resume_risk
from core.agent.turn import STOPPED_TEXT
from core.chat import Inbound, Responder
from core.fence import Fence, entered
from core.store import RunRow

log = logging.getLogger(__name__)


class CronTakeover(Protocol):
    """The scheduled jobs' side of a takeover (the application's scheduler)."""

    async def take_over_fires(self) -> None:
        """Take the fires whose workers are gone and go on with each (or report it), in the
        background; a fire's run taken over is left to this."""
        ...


class TakeoverHost(RecoveryHost, Protocol):
    """What going on with a run taken over needs of the agent."""

    max_queued: int
    cron: CronTakeover | None

    @property
    def closing(self) -> bool: ...

    async def run_in_lane(
        self,
        lane: Lane,
        responder: Responder,
        *,
        user_text: str | None,
        trigger: str = "user",
        run_id: str | None = None,
        resume: bool = False,
        inbound: Inbound | None = None,
    ) -> RunReport | None: ...


class TakingWorker(Protocol):
    """What `Takeovers` needs of its worker (`core.agent.workers.Workers`)."""

    id: str

    @property
    def host(self) -> TakeoverHost: ...

    def holding(self, run_id: str) -> AbstractContextManager[Fence]: ...

    def starting(self, conv: str, run_id: str) -> AbstractContextManager[Callable[[], bool]]: ...

    async def reload(self, lane: Lane) -> Conversation: ...

    def run_ended(self, lane: Lane, run_id: str | None) -> None: ...

    def publish(self, topic: str, payload: str) -> None: ...

    def spawn_run(
        self, run_id: str, work: Coroutine[Any, Any, None], name: str
    ) -> asyncio.Task[None] | None: ...


class Takeovers:
    """The runs one worker takes over from dead ones: taken in one statement, then each
    gone on with (`go_on`) in a task of its own, as its conversation's run."""

    def __init__(self, worker: TakingWorker) -> None:
        self.worker = worker

    async def take_over(
        self, dead: str | None, created_before: float = math.inf, silent_for: float | None = None
    ) -> list[str]:
        """See `core.agent.recovery.take_over`; each run taken over goes on here. Returns
        their ids."""
        worker = self.worker
        rows = await take_over(
            worker.host, worker.id, dead, created_before, worker.publish, silent_for=silent_for
        )
        for row in rows:
            self._go_on_soon(row)
        return [row.id for row in rows]

    async def go_on_held(self) -> None:
        """Go on with the runs this worker took over that are not going on here (their
        start failed, say on a store that was out of reach for a moment)."""
        host = self.worker.host
        if host.closing:
            return
        for row in await host.store.runs(states=["running"], limit=10_000):
            if row.worker == self.worker.id and row.reason == "taken_over":
                self._go_on_soon(row)

    def _go_on_soon(self, row: RunRow) -> None:
        host = self.worker.host
        if host.closing:
            return
        if row.trigger == "cron" and host.cron is not None:
            return  # the scheduler goes on with its fire (`CronTakeover`)
        self.worker.spawn_run(row.id, self._go_on(row), f"go on {row.id}")

    async def _go_on(self, row: RunRow) -> None:
        """Go on with a run taken over, in its lane, as its conversation's run: its
        platform calls are fenced like the run's own."""
        worker, host = self.worker, self.worker.host
        store, key = host.store, parse_conv(row.conv)
        responder = await host.responder_for(key) if row.trigger != "cron" else None
        with worker.holding(row.id) as fence, entered(fence):
            if responder is None:  # nobody to go on for here (a terminal's conversation)
                store.set_run_state(row.id, "timed_out", "interrupted", resumable=row.resumable)
                await store.flush()
                worker.publish("ended", row.id)
                return
            report: RunReport | None = None
            with worker.starting(row.conv, row.id) as stopped:  # a /stop meanwhile is kept
                lane = await host.lane(key)
                with lane.in_use():
                    lane.work(asyncio.current_task(), responder)
                    async with lane.lock:
                        conversation = await worker.reload(lane)
                    if stopped():  # /stop came while it was being taken over
                        await _stopped_before(host, row, responder)
                    else:
                        report = await go_on(host, lane, responder, row, conversation)
            if report is None and not host.closing:  # paused, stopped, or answer posted
                worker.run_ended(lane, row.id)


async def _stopped_before(host: TakeoverHost, row: RunRow, responder: Responder) -> None:
    """`/stop` reached a run taken over before it went on: it ends here."""
    store = host.store
    store.set_run_state(row.id, "cancelled", "stopped")
    await store.flush()
    await retract_previews(store, row.id, responder)
    await safe_send(responder, STOPPED_TEXT)


def pause_notice(run_id: str, why: str, waiting: int) -> str:
    """What a paused conversation is told."""
    behind = (
        f" The {waiting} message{'s' * (waiting != 1)} you sent since wait{'s' * (waiting == 1)}"
        " until then."
        if waiting
        else ""
    )
    return (
        f"I was interrupted while working on your last request (run {run_id}), and going on "
        f"by myself is not safe: {why}. Send /resume to go on anyway (that call is not run "
        "again; I will be told it may or may not have taken effect), or /skip to drop it."
        f"{behind}"
    )


async def go_on(
    host: TakeoverHost, lane: Lane, responder: Responder, row: RunRow, conversation: Conversation
) -> RunReport | None:
    """Go on with run `row`, taken over (see the module doc); the report of the resumed run,
    or None if it was paused or its stored answer was posted."""
    store = host.store
    await retract_previews(store, row.id, responder)
    checkpoint = await store.last_checkpoint(row.id)
    if checkpoint is not None and checkpoint.kind == "final":
        await _post_stored_answer(host, responder, row, conversation, checkpoint.cursor)
        return None
    why = await resume_risk(store, row.id, conversation, same_prompt=False)
    if why is not None:
        await _pause(host, responder, row, why)
        return None
    pending = [a for a in await store.pending_approvals(before=math.inf) if a.run_id == row.id]
    calls = {a.call_id for a in pending if a.call_id}
    if calls and reopen_calls(conversation.messages, calls):  # a shutdown closed them
        store.save_messages(lane.conv_id, conversation.messages, run_id=row.id)
    host.events.emit("agent_run.resumed", {"why": "takeover"}, run_id=row.id, conv=row.conv)
    return await host.run_in_lane(
        lane, responder, user_text=None, trigger=row.trigger, run_id=row.id, resume=True
    )


async def _pause(host: TakeoverHost, responder: Responder, row: RunRow, why: str) -> None:
    """The run waits for a person; so do the messages behind it."""
    store = host.store
    store.set_run_state(row.id, "waiting_on_human", "interrupted", resumable=True)
    pending = [a for a in await store.pending_approvals(before=math.inf) if a.run_id == row.id]
    store.expire_approvals(a.id for a in pending)
    host.events.emit("agent_run.paused", {"why": why}, run_id=row.id, conv=row.conv)
    await store.flush()
    waiting = await store.runs(conv=row.conv, states=["queued"], limit=host.max_queued)
    await safe_send(responder, pause_notice(row.id, why, len(waiting)))


async def _post_stored_answer(
    host: TakeoverHost, responder: Responder, row: RunRow, conversation: Conversation, cursor: int
) -> None:
    """The run had ended (its final checkpoint is stored) but not been recorded as ended:
    its answer, the last one in the history, is owed to the conversation and posted."""
    store = host.store
    answers = [m.content for m in conversation.messages[cursor:] if m.role == "assistant"]
    text = next((a for a in reversed(answers) if a), "")
    store.finish_run(
        row.id,
        state="completed",
        reason="final",
        text=text[:2000],
        iterations=row.iterations,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
    )
    store.owe_reply(row.id, text)
    await store.flush()
    if await safe_send(responder, text):
        host.events.emit("channel.reply.redelivered", {}, run_id=row.id, conv=row.conv)
    await store.reply_delivered(row.id)


__all__ = ["CronTakeover", "TakeoverHost", "Takeovers", "TakingWorker", "go_on", "pause_notice"]
