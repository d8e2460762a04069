"""One durable run, start to end (docs/durability.md): record it, run the loop, settle and deliver.

`Turn` is built by the agent for each run and used once. It marks the run running (or
resumed) in the store, runs the conversation's loop with a `RunContext` of its own,
turns whatever ended the loop — an answer, `/stop`, a shutdown, an error — into a final
state and text, records that, and delivers the text through the run's reply stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import field
from pathlib import Path
from typing import Protocol

from core import tracing
from core.agent.approvals import ApprovalDesk
from core.agent.conversation import Conversation
from core.agent.lane import Lane, RunReport, RunState
from core.agent.runs import RunRecorder, close_unanswered, reopen_resumable
from core.audit import AuditLog
from core.chat import Asker, ConversationKey, Inbound, ReplyStream, Responder, previews
from core.cost.meter import Ledger, Who
from core.errors import DeliveryFailed, ParleyError, StoreError
from core.eventlog import EventLog, RunEvents
from core.events import EventName
from core.fence import HELD, Fence, entered
from core.loop import LoopOutcome
from core.loop_tools import unanswered_calls
from core.memory.recall import recalled_message
from core.messages import Message
from core.providers.failover import FailoverProvider
from core.records import record
from core.roles import Roles
from core.run_context import RunContext, RunKind
from core.sandbox import ToolSite, default_temp_root, site_for
from core.store import Store
from core.tools.base import Approver, RoleGate
from core.tools.delegation import Delegator
from core.tools.policy import PolicyGate
from core.tools.running import release_site
from core.triggers.kinds import TRIGGER_KIND

log = logging.getLogger(__name__)

STOPPED_TEXT = "Stopped."
RESTARTING_TEXT = (
    "I am restarting and had to pause this turn; send /resume once I am back to continue."
)
RESTARTING_APPROVAL_TEXT = (
    "I am restarting while this turn waits for an approval. The request still stands: "
    "once it is answered I go on by myself."
)
FINAL_WAIT = 10.0  # seconds an answer waits for a heartbeat to show the run is still ours
RUN_ENDED: dict[RunState, EventName] = {
    "queued": "agent_run.queued",
    "running": "agent_run.running",
    "completed": "agent_run.completed",
    "cancelled": "agent_run.cancelled",
    "failed": "agent_run.failed",
    "timed_out": "agent_run.timed_out",
    "waiting_on_human": "agent_run.waiting_on_human",
}
_KINDS: dict[str, RunKind] = {"cron": "cron", "goal": "goal", "child": "child"}


_last_run_ms = 0


def new_run_id() -> str:
    """Sortable by when it was made, unique: 11 hex digits of milliseconds (strictly
    increasing within the process, so runs made in the same millisecond keep their order)
    and 5 random ones (against another process's run of the same millisecond)."""
    global _last_run_ms
    _last_run_ms = max(time.time_ns() // 1_000_000, _last_run_ms + 1)
    return f"{_last_run_ms:011x}{uuid.uuid4().hex[:5]}"


def run_scratch(run_id: str) -> Path:
    """The run's own temp dir: tools' HOME and TMPDIR, writable inside the sandbox."""
    return default_temp_root() / "runs" / run_id


class TurnHost(Protocol):
    """What a turn needs of the agent that owns its lane."""

    store: Store
    events: EventLog
    approvals: ApprovalDesk
    roles: Roles
    audit: AuditLog
    ledger: Ledger

    @property
    def closing(self) -> bool: ...

    async def conversation_of(self, lane: Lane) -> Conversation: ...

    def extra_system(self, lane: Lane) -> str: ...

    def approver(self, lane: Lane, asker: str = "") -> Approver: ...

    def delegator(self, turn: Turn) -> Delegator | None:
        """Starts `turn`'s child runs (`delegate`), or None if it may not delegate."""

    def holding(self, run_id: str) -> AbstractContextManager[Fence]:
        """The run's fence while inside: whether it is still this process's to act for
        (another worker may have taken it over, wrongly thinking this one dead)."""
        ...

    def hands_over(self, key: ConversationKey) -> bool:
        """Whether a run of conversation `key` cut off by a shutdown is left to the worker
        that takes it over (several workers), rather than paused for `/resume`."""
        ...


@record(frozen=True, slots=True)
class ParentLink:
    """A child run's place under the run that delegated it (docs/delegation-memory.md)."""

    run_id: str  # the parent's
    depth: int  # the child's: 1 under a top-level run
    deadline: float | None  # loop time by which the child must end, inside the parent's
    role: RoleGate | None = None  # the parent's: a child may use no more than it


@record(slots=True)
class _Ending:
    """How the run ended, as it will be recorded and delivered."""

    state: RunState
    text: str
    reason: str
    failure: str | None = None
    iterations: int | None = None  # LLM calls the loop made, when it ended on its own


@record(slots=True)
class Turn:
    """One run of `lane`: `user_text` (None: go on from the history, e.g. `/resume`).

    `given_id` is the id of a run that already exists in the store (queued, or the one
    being resumed); without it a new run is created.
    """

    host: TurnHost
    lane: Lane
    responder: Responder
    user_text: str | None
    trigger: str = "user"
    given_id: str | None = None
    resume: bool = False
    parent: ParentLink | None = None  # a child run's parent
    inbound: Inbound | None = None  # the message that started the run, if one did
    run_id: str = field(init=False)
    sink: RunEvents = field(init=False)
    recorder: RunRecorder | None = field(default=None, init=False)
    conversation: Conversation | None = field(default=None, init=False)
    site: ToolSite | None = field(default=None, init=False)
    fence: Fence = field(default=HELD, init=False)
    looping: bool = field(default=False, init=False)  # in the loop: a lost run is cut short
    role: RoleGate | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.run_id = self.given_id or new_run_id()
        self.role = self._role()

    def _role(self) -> RoleGate | None:
        """What the run may use (docs/governance.md#roles): its sender's roles (on the
        platform they wrote on: a reply in a trigger's thread too); a child run's
        parent's; none for a cron job (its `allow_tools` decide); for a trigger's run its
        policy, so that a tool it may not call is not even offered; the default role for
        a run whose sender this process does not know (a goal's turn, a message queued
        before a restart or taken in by another worker)."""
        if self.parent is not None:
            return self.parent.role
        if self.trigger == "cron":
            return None
        if self.trigger == TRIGGER_KIND:
            conversation = self.lane.conversation
            return None if conversation is None else PolicyGate(conversation.executor.policy)
        if self.inbound is not None:
            inbound = self.inbound
            return self.host.roles.of(inbound.channel, inbound.user_id, inbound.groups)
        return self.host.roles.of(self.lane.key[0], "")

    async def run(self) -> RunReport:
        """The whole run; never raises (but for our own cancellation by the caller).

        Its platform calls and its writes are fenced: once another worker has taken the
        run over (this one was taken for dead), the run stops where it is and nothing
        more is posted, edited, deleted or written for it here."""
        with (
            self.host.holding(self.run_id) as fence,
            entered(fence),
            tracing.run_scope(self.run_id, self.lane.conv_id, self.trigger),
        ):
            self.fence = fence
            task = asyncio.current_task()
            fence.on_lost(lambda: self._cut_short(task))
            return await self._run()

    def _cut_short(self, task: asyncio.Task[object] | None) -> None:
        """The run was found lost while its loop goes on: stop it (its tools too)."""
        if self.looping and task is not None and not task.done():
            task.cancel()

    async def _run(self) -> RunReport:
        lane, store = self.lane, self.host.store
        lane.begin_run(self.run_id)
        Store.write_for(lane.conv_id)  # this task's failed writes are this run's to report
        stream = self.responder.stream()
        tags = {"parent_run_id": self.parent.run_id} if self.parent is not None else None
        self.sink = RunEvents(
            self.host.events, stream, run_id=self.run_id, conv=lane.conv_id, tags=tags
        )
        if previews(stream):  # remember previews, to retract them after a crash
            stream.on_posted = lambda message_id: self.sink.emit(
                "channel.preview.posted", {"message_id": message_id}
            )
            # Nothing shows in the chat before the run's start (running, its input
            # checkpoint) is committed: a crash after a preview then leaves a run that
            # recovery announces as interrupted, not one it takes for never begun and
            # answers again. (The final text waits for the flush below anyway.)
            stream.before_preview = store.committed
        ending = await self._ending()
        if self.fence.lost or ending.reason == "handed_over":
            return await self._lost(stream, ending)
        lane.delivering()
        self._record(ending)
        # Owed to the conversation until the platform takes it (a post can wait seconds
        # in a rate limiter): a crash meanwhile leaves it to recovery, not lost.
        owed = self.parent is None and self.trigger != "cron"
        if owed:
            store.owe_reply(self.run_id, ending.text)
        try:
            await store.flush()
        except StoreError as exc:  # what this run wrote may be lost: say so, loudly
            log.error("run %s: %s", self.run_id, exc)
            failure = f"I could not save this run ({exc})"
            ending = _Ending("failed", f"Sorry, that failed: {failure}.", "store_error", failure)
            store.set_run_state(self.run_id, "failed", "store_error")
            with contextlib.suppress(StoreError):
                await store.flush()
        lane.end_run(ending.state)
        fence: Fence = self.fence  # sure of the run before the answer goes out
        if not await fence.holds(FINAL_WAIT):
            if fence.lost:
                return await self._lost(stream, ending)
            # The store is out of reach and cannot say: the answer goes out (a lost
            # answer is worse than a repeated one).
            log.warning("run %s: delivering without a heartbeat to vouch for it", self.run_id)
            fence = HELD
        try:
            with entered(fence):
                await stream.finish(ending.text)
        except DeliveryFailed:
            log.warning("reply of run %s was not delivered", self.run_id, exc_info=True)
            self.sink.emit("channel.delivery.failed", {})
        if owed:
            try:
                await store.reply_delivered(self.run_id)
            except StoreError:  # still owed: recovery posts it again after a restart
                log.error("run %s: its delivered answer is still recorded owed", self.run_id)
        return self._report(ending)

    async def _ending(self) -> _Ending:
        """Run the loop; whatever stops it becomes the run's ending. Everything that
        awaits is in here: a `/stop` at any point is handled the same way."""
        self.looping = True
        try:
            outcome = await self._loop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return self._interrupted()
        except ParleyError as exc:
            log.warning("run %s failed: %s", self.run_id, exc)
            return _Ending("failed", f"Sorry, that failed: {exc}", "failed", str(exc))
        except Exception as exc:
            log.exception("run %s crashed", self.run_id)
            failure = f"something went wrong ({type(exc).__name__})"
            return _Ending("failed", f"Sorry, {failure}.", "failed", failure)
        finally:
            self.looping = False
        text = outcome.text
        provider = self.conversation.provider if self.conversation is not None else None
        if isinstance(provider, FailoverProvider) and provider.turn_note and text:
            text += f"\n\n_(answered by fallback {provider.turn_note})_"
        return _Ending(_state_of(outcome), text, outcome.reason, iterations=outcome.iterations)

    async def _loop(self) -> LoopOutcome:
        lane = self.lane
        conversation = self.conversation = await self.host.conversation_of(lane)
        site = self.site = self._site(conversation)
        recorder = self.recorder = await self._start(conversation)
        ctx = RunContext(
            run_id=self.run_id,
            conv=lane.conv_id,
            kind=_KINDS.get(self.trigger, "chat"),
            sink=self.sink,
            recorder=recorder,
            envelope=recorder,
            approver=self.host.approver(lane, self._actor()),
            scratch=site.scratch,
            site=site,
            deadline=self.parent.deadline if self.parent is not None else None,
            parent_run_id=self.parent.run_id if self.parent is not None else None,
            delegator=self.host.delegator(self),
            asker=(asker := self._asker()),
            role=self.role,
            audit=self.host.audit,
            meter=self.host.ledger.for_run(Who.of(self.run_id, lane.conv_id, asker), self.sink),
        )
        if self.user_text is not None:
            memory = conversation.executor.ctx.memory
            recalled = await recalled_message(memory, ctx, self.user_text)
            if pending := unanswered_calls(conversation.messages):
                # New input supersedes an interrupted run: close its calls, never re-run.
                close_unanswered(conversation.messages, pending, {})
            if recalled is not None:  # quoted data, kept out of the system message
                conversation.messages.append(recalled)
            conversation.messages.append(Message.user(self.user_text))
        recorder.cursor = len(conversation.messages)
        recorder.checkpoint("input", 0, conversation.messages)
        self.sink.emit(
            "agent_run.started", {"trigger": self.trigger, "provider": lane.provider_name}
        )
        async with self.responder.typing():
            return await conversation.run(ctx)

    def _site(self, conversation: Conversation) -> ToolSite:
        """Where this run's tools work (its channel's or conversation's workspace, its
        scratch dir, its conversation's artifacts); the system message and the context
        manager's offloaded results follow it."""
        site = site_for(
            conversation.executor.ctx.sandbox, self.lane.conv_id, run_scratch(self.run_id)
        )
        conversation.place(site)
        return site

    def _actor(self) -> str:
        """Who the run answers, as the audit log names them: `<platform>:<user id>`, else
        what started it (`goal`, `resume`, …)."""
        if self.inbound is not None and self.inbound.user_id:
            return f"{self.inbound.channel}:{self.inbound.user_id}"
        return self.trigger

    def _asker(self) -> Asker:
        """Who the run answers: the sender of its message, else nobody in the lane's
        channel (a cron job, a resumed run), which no person's own memory is shown to."""
        if self.inbound is not None:
            return self.inbound.asker(self.lane.conv_id, self.run_id)
        channel, channel_id, _ = self.lane.key
        return Asker(channel, channel_id, "", False, self.lane.conv_id, self.run_id)

    async def _start(self, conversation: Conversation) -> RunRecorder:
        """Record the run as running and give it its recorder (checkpoints, envelope)."""
        store, conv_id = self.host.store, self.lane.conv_id
        if self.resume and await reopen_resumable(store, self.run_id, conversation):
            store.save_messages(conv_id, conversation.messages)
        replayable = (
            {c.id for c in unanswered_calls(conversation.messages)} if self.resume else set()
        )
        recorder = RunRecorder(
            store,
            conv_id,
            self.run_id,
            conversation.prompt_hash(),
            replayable=replayable,
            fence=self.fence,
        )
        recorder.persisted = list(conversation.messages)
        if self.resume:
            store.resume_run(self.run_id)
        else:
            store.forget_resumable(conv_id)
            if self.given_id is None:
                await store.create_run(self.run_id, conv_id, self.trigger)
            else:  # a queued run starts
                store.start_run(self.run_id)
        conversation.refresh_system(self.host.extra_system(self.lane))
        return recorder

    def _interrupted(self) -> _Ending:
        """`/stop` ended the run, or a shutdown did: then it stays resumable; or it was
        found lost: then nothing is recorded here."""
        if self.fence.lost:
            return _Ending("timed_out", "", "taken_over")
        if not self.host.closing or self.recorder is None:
            return _Ending("cancelled", STOPPED_TEXT, "cancelled")
        if self.trigger != "cron" and self.host.hands_over(self.lane.key):
            # Several workers: it stays running here, as this worker's, and the worker that
            # finds this one gone takes it over and goes on with it (no /resume needed).
            return _Ending("timed_out", "", "handed_over")
        held = self.run_id in self.host.approvals.held  # goes on by itself after a restart
        self.host.store.mark_resumable(self.run_id)
        text = RESTARTING_APPROVAL_TEXT if held else RESTARTING_TEXT
        return _Ending("timed_out", text, "timed_out")

    def _record(self, ending: _Ending) -> None:
        """The final checkpoint, the scratch dir removed, the snapshot and the run row."""
        lane, store, recorder, sink = self.lane, self.host.store, self.recorder, self.sink
        conversation = self.conversation
        if conversation is not None and recorder is not None:
            recorder.checkpoint("final", recorder.iteration, conversation.messages)
            lane.add_usage(sink.input_tokens, sink.output_tokens)
            context = conversation.guards.context
            report = context.last_compaction if context is not None else None
            if report is not None:
                lane.compacted(report.before, report.after, report.kind)
            lane.save_snapshot(store)
        if self.site is not None:  # its file thread closed, its scratch dir removed
            release_site(self.site)
        store.finish_run(
            self.run_id,
            state=ending.state,
            reason=ending.reason,
            text=ending.text[:2000],
            iterations=recorder.iteration if recorder else 0,
            input_tokens=sink.input_tokens,
            output_tokens=sink.output_tokens,
        )
        sink.emit(RUN_ENDED[ending.state], {"reason": ending.reason})

    async def _lost(self, stream: ReplyStream, ending: _Ending) -> RunReport:
        """Another worker took the run over (this one was taken for dead), or will (this
        one is stopping): it goes on there, below the previews it retracts. Nothing is
        delivered, retracted or recorded here; the stream stops at once."""
        if ending.reason == "handed_over":
            log.info("run %s is left to the worker that takes it over", self.run_id)
        else:
            log.warning(
                "run %s was taken over by another worker; nothing more is posted here",
                self.run_id,
            )
            self.sink.emit("agent_run.lost", {})
        if previews(stream):
            await stream.aclose()
        self.lane.end_run("timed_out")
        self.lane.mark_stale()  # its history goes on elsewhere: loaded again before the next run
        return self._report(_Ending("timed_out", "", ending.reason, iterations=ending.iterations))

    def _report(self, ending: _Ending) -> RunReport:
        return RunReport(
            self.run_id,
            ending.state,
            ending.text,
            self.sink.input_tokens,
            self.sink.output_tokens,
            ending.iterations or (self.recorder.iteration if self.recorder else 0),
            ending.reason,
            ending.failure,
        )


def _state_of(outcome: LoopOutcome) -> RunState:
    match outcome.reason:
        case "waiting_on_human":
            return "waiting_on_human"
        case "time_limit":
            return "timed_out"
        case _:
            return "completed"


__all__ = ["STOPPED_TEXT", "ParentLink", "Turn", "TurnHost", "new_run_id", "run_scratch"]
