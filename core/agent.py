"""The durable conversation agent (SPEC §7, §8).

`Agent` keeps one `Lane` per conversation key (its `core.conversation.Conversation` holds
the history and what a turn needs): messages queue in order and run one at a time, commands act
at once (`/stop` reaches the running run immediately), and different lanes run
concurrently. Every run is recorded in the store with checkpoints at its safe boundaries
and an idempotency envelope around each tool call, so a crash is resumable with `/resume`
without repeating a side effect. A run that was waiting on an approver goes on by itself
after a restart (`core.approvals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from core.approvals import ApprovalDesk
from core.chat import ApprovalRequest, ConversationKey, DeliveryError, Inbound, Responder
from core.clock import Clock, SystemClock
from core.command_table import parse_command
from core.commands import Commands
from core.config import GoalsConfig
from core.conversation import Conversation, Wiring
from core.errors import ParleyError, StoreError
from core.eventlog import EventLog, RunEvents
from core.journal import JournalBox
from core.loop import LoopOutcome, unanswered_calls
from core.messages import Message, ToolCall
from core.runs import (
    RunRecorder,
    close_unanswered,
    reconcile_runs,
    reopen_calls,
    resume_blocker,
)
from core.store import ApprovalRow, GoalRow, Store
from core.tools.base import Approver, default_temp_root
from core.tools.reaper import kill_leftovers

log = logging.getLogger(__name__)

RunState = Literal[
    "queued", "running", "completed", "cancelled", "failed", "timed_out", "waiting_on_human"
]
TERMINAL_STATES = ("completed", "cancelled", "failed", "timed_out", "waiting_on_human")
PREVIEW_RETRACTED = "(interrupted by a restart — the answer continues below)"
STOPPED_TEXT = "Stopped."
MAX_LANES = 1000  # conversations kept in memory; idle ones beyond it reload from the store
RESTARTING_TEXT = (
    "I am restarting and had to pause this turn; send /resume once I am back to continue."
)
RESTARTING_APPROVAL_TEXT = (
    "I am restarting while this turn waits for an approval. The request still stands: "
    "once it is answered I go on by myself."
)


def conv_id(key: ConversationKey) -> str:
    """The conversation key as one string: `slack:C0123:1700000000.0001`."""
    return ":".join(key)


def parse_conv(conv: str) -> ConversationKey:
    channel, channel_id, thread = [*conv.split(":", 2), "", ""][:3]
    return (channel, channel_id, thread)


def new_run_id() -> str:
    """Sortable by time, unique: 8 hex digits of seconds + 8 random."""
    return f"{int(time.time()):08x}{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class Lane:
    """One conversation: its queue, its history and its running run (if any)."""

    key: ConversationKey
    conv: str
    journal: JournalBox
    conversation: Conversation | None = None
    provider_name: str = ""
    queue: deque[tuple[Inbound, Responder, str]] = field(default_factory=deque)  # + run id
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one run at a time
    worker: asyncio.Task[None] | None = None
    run_task: asyncio.Task[LoopOutcome | None] | None = None
    run_id: str | None = None
    last_state: str | None = None
    responder: Responder | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    goal: GoalRow | None = None
    goal_task: asyncio.Task[None] | None = None
    last_compaction: str | None = None
    generation: int = 0  # of the configuration its conversation was built from
    stoppable: bool = False  # the run is in its loop; after it, /stop lets it deliver
    pinned: bool = False  # a conversation built by its owner (a cron job): never rebuilt

    users: int = 0  # submits in progress

    @property
    def busy(self) -> bool:
        return self.run_task is not None and not self.run_task.done()

    @property
    def idle(self) -> bool:
        """Nothing running, queued, being taken in or driving a goal: safe to evict."""
        tasks = (self.run_task, self.worker, self.goal_task)
        return not self.users and not self.queue and all(t is None or t.done() for t in tasks)


class Agent:
    """One per process: lanes keyed by conversation, all sharing one store."""

    def __init__(
        self,
        store: Store,
        wiring: Wiring,
        *,
        events: EventLog | None = None,
        clock: Clock | None = None,
        approval_timeout: float = 300.0,
        responders: Callable[[ConversationKey], Responder | None] | None = None,
        goal_settings: GoalsConfig | None = None,
        max_queued: int = 20,
    ) -> None:
        self.store = store
        self.max_queued = max_queued  # messages waiting per conversation; more are turned away
        self.wiring = wiring
        self.events = events or EventLog(store)
        self.clock = clock or SystemClock()
        self.approval_timeout = approval_timeout
        self.responders = responders or (lambda key: None)
        self.goal_settings = goal_settings or GoalsConfig()
        self.lanes: dict[ConversationKey, Lane] = {}
        self._lane_locks: dict[ConversationKey, asyncio.Lock] = {}
        self._closing = False
        self._taking_in: set[tuple[str, str]] = set()  # platform events being taken in
        self.started_at = time.time()
        self.max_lanes = MAX_LANES
        self.commands = Commands(self)
        self.approvals = ApprovalDesk(store, self.events, lambda: self._closing)

    # --- input ------------------------------------------------------------------------

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        if self._closing:  # not marked seen: a redelivery after the restart is answered
            await _safe_send(responder, "Parley is restarting; please send that again soon.")
            return True
        event = (inbound.channel, inbound.event_id)
        if inbound.event_id:
            duplicate = event in self._taking_in  # checked and claimed with no await between
            self._taking_in.add(event)
            if duplicate or await self.store.seen(*event):
                if not duplicate:
                    self._taking_in.discard(event)
                self.events.emit("channel.event.duplicate", {"channel": event[0], "id": event[1]})
                return False
        lane = await self.lane(inbound.key)
        lane.users += 1  # not evicted while this message is being taken in
        try:
            lane.responder = responder
            if parse_command(inbound.text) is not None:
                if inbound.event_id:
                    await self.store.mark_seen(*event)
                await self.commands.handle(lane, inbound, responder)
                return True
            if len(lane.queue) >= self.max_queued:
                return await self._turn_away(lane, inbound, responder)
            # The message is durable (a queued run, marked seen in the same commit) before
            # the platform hears "received": a crash before its turn re-queues it at
            # start-up, and neither loses it nor answers it twice.
            run_id = new_run_id()
            if inbound.event_id:
                self.store.mark_seen_soon(*event)
            await self.store.create_run(
                run_id, lane.conv, "user", state="queued", text=inbound.text
            )
            lane.queue.append((inbound, responder, run_id))
            if lane.worker is None or lane.worker.done():
                lane.worker = _spawn(self._drain(lane), f"lane {lane.conv}")
            return True
        finally:
            lane.users -= 1
            self._taking_in.discard(event)

    async def _turn_away(self, lane: Lane, inbound: Inbound, responder: Responder) -> bool:
        """A full queue: the message is not queued, and its sender is told so."""
        if inbound.event_id:
            await self.store.mark_seen(inbound.channel, inbound.event_id)
        self.events.emit("agent.queue.full", {"queued": len(lane.queue)}, conv=lane.conv)
        await _safe_send(
            responder,
            f"I already have {len(lane.queue)} messages waiting in this conversation, so I "
            "did not queue that one. Send it again once I have caught up (/stop drops the "
            "queue).",
        )
        return True

    async def lane(self, key: ConversationKey) -> Lane:
        """The lane of `key`, loaded from the store on first use."""
        if (lane := self.lanes.pop(key, None)) is not None:
            self.lanes[key] = lane  # most recently used last
            return lane
        lock = self._lane_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if (lane := self.lanes.get(key)) is not None:
                return lane
            conv = conv_id(key)
            store = self.store
            journal = JournalBox.from_data(
                await store.journal(conv), lambda j: store.save_journal(conv, j.model_dump())
            )
            lane = Lane(key, conv, journal)
            row = await store.conversation(conv)
            if row is not None:
                lane.input_tokens, lane.output_tokens = row.input_tokens, row.output_tokens
                lane.last_compaction = row.last_compaction
            lane.goal = await store.goal(conv)
            await self.conversation_of(lane, await store.load_messages(conv))
            self.lanes[key] = lane
            self._evict_idle()
            return lane

    def _evict_idle(self) -> None:
        """Keep at most `max_lanes` in memory: the least recently used idle ones go (the
        store has their history; they load again on the next message)."""
        excess = len(self.lanes) - self.max_lanes
        for key in list(self.lanes):
            if excess <= 0:
                return
            lane = self.lanes[key]
            if lane.idle:
                self.drop_lane(key)
                excess -= 1

    async def conversation_of(
        self, lane: Lane, messages: list[Message] | None = None
    ) -> Conversation:
        """Build (or rebuild, after `/provider`) the lane's conversation."""
        current = lane.conversation
        if current is not None and lane.pinned:
            return current
        wanted = await self.provider_for(lane.key)
        fresh = lane.generation == self.wiring.generation
        if current is not None and lane.provider_name == wanted and fresh:
            return current
        conversation = self.wiring.conversation(wanted, self._approver(lane), lane.journal)
        conversation.messages = (
            messages if messages is not None else (current.messages if current else [])
        )
        conversation.extra_system = lambda: self._extra_system(lane)
        context = conversation.guards.context
        if context is not None:
            context.after_summary = lambda: (
                "" if lane.journal.journal.is_empty() else lane.journal.journal.render()
            )
        lane.conversation, lane.provider_name = conversation, wanted
        lane.generation = self.wiring.generation
        return conversation

    @property
    def closing(self) -> bool:
        """True once `shutdown` began: no new input is taken."""
        return self._closing

    def drop_lane(self, key: ConversationKey) -> None:
        """Forget an idle lane (a finished cron run's); the store keeps its history."""
        lane = self.lanes.pop(key, None)
        self._lane_locks.pop(key, None)
        if lane is not None and not lane.idle:  # never drop a lane with work in it
            self.lanes[key] = lane

    async def provider_for(self, key: ConversationKey) -> str:
        """The stored preference of this channel, silently the default when it is gone."""
        stored = await self.store.provider_pref(key[0], key[1])
        if stored is not None and stored in self.wiring.provider_names():
            return stored
        return self.wiring.default_provider

    def _extra_system(self, lane: Lane) -> str:
        parts = []
        if digest := lane.journal.journal.digest():
            parts.append(f"Run journal (digest): {digest}")
        goal = lane.goal
        if goal is not None and goal.state == "active":
            parts.append(f"Active goal: {goal.text}")
        return "\n".join(parts)

    def _approver(self, lane: Lane) -> Approver:
        return _LaneApprover(self, lane)

    async def answer_approval(
        self, request_id: str, allow: bool, user_name: str
    ) -> ApprovalRequest | None:
        """`core.chat.AgentPort.answer_approval`."""
        return await self.approvals.answer(request_id, allow, user_name)

    # --- runs ---------------------------------------------------------------------------

    async def _drain(self, lane: Lane) -> None:
        """The lane's worker: one queued message at a time, in order."""
        while lane.queue and not self._closing:
            inbound, responder, run_id = lane.queue.popleft()
            lane.responder = responder
            await self.run_in_lane(lane, responder, user_text=inbound.text, run_id=run_id)

    async def run_in_lane(
        self,
        lane: Lane,
        responder: Responder,
        *,
        user_text: str | None,
        trigger: str = "user",
        run_id: str | None = None,
        resume: bool = False,
    ) -> LoopOutcome | None:
        """Run one turn as the lane's run task (so `/stop` can cancel it alone); one run
        at a time per lane, whoever asks (the queue worker, `/resume`, a goal driver)."""
        if self._closing:
            return None
        async with lane.lock:
            task = asyncio.create_task(
                self._run(lane, responder, user_text, trigger, run_id, resume),
                name=f"run {lane.conv}",
            )
            lane.run_task = task
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # the caller itself is cancelled
                    task.cancel()
                    await asyncio.wait({task})
                    raise
                # /stop reached the run before it began: it never ran, record that.
                if run_id is not None:
                    self.store.set_run_state(run_id, "cancelled", "stopped")
                lane.last_state, lane.run_id = "cancelled", None
                return None

    async def _run(
        self,
        lane: Lane,
        responder: Responder,
        user_text: str | None,
        trigger: str,
        given_id: str | None,
        resume: bool,
    ) -> LoopOutcome | None:
        run_id = given_id or new_run_id()
        lane.run_id, lane.stoppable = run_id, True
        Store.write_for(lane.conv)  # this task's failed writes are this run's to report
        stream = responder.stream()
        sink = RunEvents(self.events, stream, run_id=run_id, conv=lane.conv)
        if hasattr(stream, "on_posted"):  # remember previews, to retract them after a crash
            stream.on_posted = lambda message_id: sink.emit(
                "channel.preview.posted", {"message_id": message_id}
            )
        conversation: Conversation | None = None
        recorder: RunRecorder | None = None
        outcome: LoopOutcome | None = None
        state: RunState
        try:  # everything that awaits is in here: a /stop at any point is handled below
            conversation = await self.conversation_of(lane)
            recorder = await self._start_run(lane, conversation, run_id, trigger, given_id, resume)
            if user_text is not None:
                if pending := unanswered_calls(conversation.messages):
                    # New input supersedes an interrupted run: close its calls, never re-run.
                    close_unanswered(conversation.messages, pending, {})
                conversation.messages.append(Message.user(user_text))
            recorder.cursor = len(conversation.messages)
            recorder.checkpoint("input", 0, conversation.messages)
            sink.emit("agent_run.started", {"trigger": trigger, "provider": lane.provider_name})
            async with responder.typing():
                outcome = await conversation.run(sink, recorder)
            state = _state_of(outcome)
            text = outcome.text
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            state, text = "cancelled", STOPPED_TEXT
            if self._closing and recorder is not None:  # a shutdown, not /stop: resumable
                held = run_id in self.approvals.held  # goes on by itself after the restart
                state, text = "timed_out", RESTARTING_APPROVAL_TEXT if held else RESTARTING_TEXT
                self.store.mark_resumable(run_id)
        except ParleyError as exc:
            state, text = "failed", f"Sorry, that failed: {exc}"
            log.warning("run %s failed: %s", run_id, exc)
        except Exception as exc:
            state, text = "failed", f"Sorry, something went wrong ({type(exc).__name__})."
            log.exception("run %s crashed", run_id)
        lane.stoppable = False  # from here on the answer is delivered, not cut short
        if conversation is not None and recorder is not None:
            self._finish_run(lane, conversation, recorder, sink)
        self.store.finish_run(
            run_id,
            state=state,
            reason=outcome.reason if outcome else state,
            text=text[:2000],
            iterations=recorder.iteration if recorder else 0,
            input_tokens=sink.input_tokens,
            output_tokens=sink.output_tokens,
        )
        sink.emit(f"agent_run.{state}", {"reason": outcome.reason if outcome else state})
        try:
            await self.store.flush()
        except StoreError as exc:  # what this run wrote may be lost: say so, loudly
            log.error("run %s: %s", run_id, exc)
            state, text = "failed", f"Sorry, that failed: I could not save this run ({exc})."
            self.store.set_run_state(run_id, state, "store_error")
            with contextlib.suppress(StoreError):
                await self.store.flush()
        lane.last_state, lane.run_id = state, None
        try:
            await stream.finish(text)
        except DeliveryError:
            log.warning("reply of run %s was not delivered", run_id, exc_info=True)
            sink.emit("channel.delivery.failed", {})
        return outcome

    async def _start_run(
        self,
        lane: Lane,
        conversation: Conversation,
        run_id: str,
        trigger: str,
        given_id: str | None,
        resume: bool,
    ) -> RunRecorder:
        """Record the run as running and give it its recorder (checkpoints, envelope)."""
        replayable = {c.id for c in unanswered_calls(conversation.messages)} if resume else set()
        recorder = RunRecorder(
            self.store, lane.conv, run_id, conversation.prompt_hash(), replayable=replayable
        )
        recorder.persisted = list(conversation.messages)
        conversation.executor.envelope = recorder
        # The run's own temp dir: tools' HOME and TMPDIR, writable inside the sandbox.
        conversation.executor.ctx.scratch = default_temp_root() / "runs" / run_id
        if resume:
            self.store.resume_run(run_id)
        else:
            self.store.forget_resumable(lane.conv)
            if given_id is None:
                await self.store.create_run(run_id, lane.conv, trigger)
            else:  # a queued run starts
                self.store.start_run(run_id)
        conversation.refresh_system()
        return recorder

    def _finish_run(
        self, lane: Lane, conversation: Conversation, recorder: RunRecorder, sink: RunEvents
    ) -> None:
        """The final checkpoint and the session snapshot."""
        recorder.checkpoint("final", recorder.iteration, conversation.messages)
        conversation.executor.envelope = None
        scratch, conversation.executor.ctx.scratch = conversation.executor.ctx.scratch, None
        if scratch is not None and scratch.exists():
            asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, scratch, True)
        lane.input_tokens += sink.input_tokens
        lane.output_tokens += sink.output_tokens
        context = conversation.guards.context
        report = context.last_compaction if context is not None else None
        if report is not None:
            lane.last_compaction = f"{report.before}→{report.after} ({report.kind})"
        self.store.save_snapshot(
            lane.conv,
            input_tokens=lane.input_tokens,
            output_tokens=lane.output_tokens,
            last_compaction=lane.last_compaction,
        )

    async def stop(self, lane: Lane) -> bool:
        """Cancel the lane's running run; True if there was one."""
        task = lane.run_task
        if task is None or task.done():
            return False
        if lane.stoppable:  # a run already delivering its answer is left to finish
            task.cancel()
        await asyncio.wait({task})  # never raises; our own cancellation still propagates
        return True

    async def cancel_running(self, key: ConversationKey) -> bool:
        """`AgentPort.cancel_running`: `stop` the run of conversation `key`, if any."""
        lane = self.lanes.get(key)
        return lane is not None and await self.stop(lane)

    # --- autonomous goals ---------------------------------------------------------------

    def start_goal(self, lane: Lane, responder: Responder) -> None:
        """Drive the lane's goal without user input (`/goal create … --auto`)."""
        from core.goals import drive_goal

        lane.goal_task = _spawn(drive_goal(self, lane, responder), f"goal {lane.conv}")

    async def stop_goal(self, lane: Lane) -> bool:
        task = lane.goal_task
        if task is None or task.done():
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    # --- resume and reconcile ------------------------------------------------------------

    async def resume(self, lane: Lane, responder: Responder) -> str | None:
        """Continue the lane's interrupted run; returns a message for the user if it cannot."""
        candidates = await self.store.runs(conv=lane.conv, limit=5)
        run = next((r for r in candidates if r.resumable), None)
        if run is None:
            return "There is no interrupted run to resume here."
        return await self._resume_run(lane, responder, run.id)

    async def _resume_run(self, lane: Lane, responder: Responder, run_id: str) -> str | None:
        """Continue run `run_id` in the lane, or say why it cannot safely go on."""
        conversation = await self.conversation_of(lane)
        why = await resume_blocker(self.store, run_id, conversation)
        if why is not None:
            text = (
                f"I can't safely resume run {run_id}: {why}. Please check what happened and "
                "tell me how to go on."
            )
            conversation.messages.append(Message.assistant(text))
            self.store.save_messages(lane.conv, conversation.messages)
            self.store.set_run_state(run_id, "waiting_on_human", "unsafe", resumable=False)
            self.events.emit("agent_run.resume_unsafe", {"why": why}, run_id=run_id, conv=lane.conv)
            lane.last_state = "waiting_on_human"
            await self.store.flush()
            return text
        if lane.busy or lane.queue or (lane.worker is not None and not lane.worker.done()):
            return "A message arrived meanwhile; send /resume again once it is answered."
        resumed = self._resume_then_drain(lane, responder, run_id)
        lane.worker = _spawn(resumed, f"resume {lane.conv}")
        return None

    async def _resume_then_drain(self, lane: Lane, responder: Responder, run_id: str) -> None:
        await self.run_in_lane(
            lane, responder, user_text=None, trigger="resume", run_id=run_id, resume=True
        )
        await self._drain(lane)

    async def reconcile(self) -> list[str]:
        """At start-up: runs left `running` by a crash become `timed_out`; those with a
        checkpoint to go on from are announced in their conversation with a /resume hint,
        except runs that were waiting on an approver: they go on at once, waiting again
        on the same request (its prompt, its deadline)."""
        # Only runs of earlier processes: channels may already be delivering new messages.
        interrupted = await reconcile_runs(self.store, self.events, before=self.started_at)
        killed = kill_leftovers(await self.store.take_tool_groups())
        if killed:
            self.events.emit("agent.tool_groups_killed", {"count": killed})
        pending = await self.store.pending_approvals(before=self.started_at)
        waiting = await self._resume_waiting(pending)
        self.store.expire_approvals(a.id for a in pending if a.run_id not in waiting)
        for run in interrupted:
            if run.id in waiting:
                continue
            responder = self.responders(parse_conv(run.conv))
            if responder is not None:
                await self._retract_previews(run.id, responder)
                await _safe_send(
                    responder,
                    f"I was interrupted while working on your last request (run {run.id}). "
                    "Send /resume to continue where I stopped.",
                )
        for run in reversed(await self.store.runs(states=["queued"], limit=10_000)):
            if run.created_at < self.started_at:
                await self._requeue(run.id, run.conv, run.text or "")
        await self.store.flush()
        return [run.id for run in interrupted]

    async def _resume_waiting(self, pending: list[ApprovalRow]) -> set[str]:
        """Resume the interrupted runs that were waiting on the `pending` requests; returns
        their ids. A run that cannot safely go on says why in its conversation."""
        calls: dict[str, set[str]] = {}
        for approval in pending:
            if approval.run_id and approval.call_id:
                calls.setdefault(approval.run_id, set()).add(approval.call_id)
        resumed: set[str] = set()
        for run_id, call_ids in calls.items():
            run = await self.store.run(run_id)
            if run is None or run.state != "timed_out" or not run.resumable:
                continue
            recent = await self.store.runs(conv=run.conv, limit=10)
            if next((r.id for r in recent if r.state != "queued"), None) != run.id:
                continue  # a later run superseded it (new input before this start-up)
            key = parse_conv(run.conv)
            responder = self.responders(key)
            lane = await self.lane(key)
            worker = lane.worker
            if responder is None or lane.busy or lane.queue or (worker and not worker.done()):
                continue  # nobody to ask, or new input came first: it supersedes the run
            lane.responder = responder
            conversation = await self.conversation_of(lane)
            if reopen_calls(conversation.messages, call_ids):  # a shutdown closed them
                self.store.save_messages(lane.conv, conversation.messages)
            why = await self._resume_run(lane, responder, run.id)
            if why is not None:
                await _safe_send(responder, why)
                continue
            self.events.emit("agent_run.resumed", {"why": "approval"}, run_id=run.id, conv=run.conv)
            resumed.add(run.id)
        return resumed

    async def _retract_previews(self, run_id: str, responder: Responder) -> None:
        """The half-streamed answer a crash left in the chat would read like a second,
        unfinished reply: edit it to say the answer continues below."""
        posted = [
            str(data.get("message_id"))
            for _at, name, _iteration, data in await self.store.events(run_id)
            if name == "channel.preview.posted"
        ]
        if not posted:
            return
        retract = getattr(responder.stream(), "retract", None)  # channels that edit have it
        if retract is not None:
            await retract(posted, PREVIEW_RETRACTED)

    async def _requeue(self, run_id: str, conv: str, text: str) -> None:
        """A message that was queued when the process stopped gets its turn now."""
        key = parse_conv(conv)
        responder = self.responders(key)
        if responder is None:
            self.store.set_run_state(run_id, "failed", "no channel to answer in")
            return
        lane = await self.lane(key)
        inbound = Inbound(*key, user_id="", user_name="", text=text)
        lane.queue.append((inbound, responder, run_id))
        self.events.emit("agent_run.requeued", {}, run_id=run_id, conv=conv)
        if lane.worker is None or lane.worker.done():
            lane.worker = _spawn(self._drain(lane), f"lane {lane.conv}")

    # --- lifecycle -----------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Until every lane's queue is drained and no run is running (tests, shutdown)."""
        while True:
            workers = [lane.worker for lane in self.lanes.values() if lane.worker]
            busy = [w for w in workers if not w.done()]
            if not busy:
                return
            await asyncio.wait(busy)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop taking input; let running turns reach a checkpoint (up to `grace`
        seconds), then cancel what is left (those runs stay resumable)."""
        self._closing = True
        lanes = list(self.lanes.values())  # submits after this point are turned away
        for lane in lanes:
            await self.stop_goal(lane)
        running = [lane.worker for lane in lanes if lane.worker and not lane.worker.done()]
        if running:
            await asyncio.wait(running, timeout=grace)
        for lane in lanes:
            await self.stop(lane)
            if lane.worker and not lane.worker.done():
                lane.worker.cancel()
                await asyncio.wait({lane.worker})
        await self.store.flush()


class _LaneApprover:
    """A lane's approver (`core.tools.base.CallApprover`): asks through the lane's current
    responder, keyed by the lane's running run and the tool call."""

    __slots__ = ("agent", "lane")

    def __init__(self, agent: Agent, lane: Lane) -> None:
        self.agent, self.lane = agent, lane

    async def __call__(self, tool: str, summary: str, reason: str) -> bool:
        """A call without an id (outside the loop): asked, but not taken up after a restart."""
        return await self.approve_call(ToolCall(id="", name=tool), summary, reason)

    async def approve_call(self, call: ToolCall, summary: str, reason: str) -> bool:
        lane, agent = self.lane, self.agent
        if lane.responder is None:
            return False
        return await agent.approvals.ask(
            lane.responder, lane.conv, lane.run_id, call, summary, reason, agent.approval_timeout
        )


def _state_of(outcome: LoopOutcome) -> RunState:
    match outcome.reason:
        case "waiting_on_human":
            return "waiting_on_human"
        case "time_limit":
            return "timed_out"
        case _:
            return "completed"


def _spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task whose failure is logged, never lost ("exception was never retrieved")."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s failed", task.get_name(), exc_info=exc)


async def _safe_send(responder: Responder, text: str) -> bool:
    try:
        await responder.send(text)
    except DeliveryError:
        log.warning("could not post to the conversation", exc_info=True)
        return False
    return True


__all__ = ["Agent", "Lane", "conv_id", "parse_conv"]
