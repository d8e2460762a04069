"""The durable conversation agent (docs/durability.md, docs/commands.md).

`Agent` keeps one `Lane` per conversation key (its `Conversation` holds the history and what
a turn needs) and takes input in: a command acts at once (`/stop` reaches the running run
immediately); other text is a queued run in the store, which the one dispatcher
(`core.agent.dispatcher`, docs/durability.md#the-queue) hands out in order, one run at a
time per conversation, different conversations concurrently. Every run is recorded with
checkpoints at its safe boundaries and an idempotency envelope around each tool call, so a
crash is resumable with `/resume` (`core.agent.resuming`) without repeating a side effect;
a run waiting on an approver goes on by itself after a restart (`core.agent.approvals`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from core.agent import resuming
from core.agent.approvals import ApprovalDesk, LaneApprover
from core.agent.children import delegator_for
from core.agent.commands import Commands
from core.agent.conversation import Conversation, ConversationFactory
from core.agent.dispatcher import Dispatcher
from core.agent.goals import drive_goal
from core.agent.journal import JournalBox
from core.agent.lane import Lane, RunReport
from core.agent.prefs import ProviderPrefs
from core.agent.recovery import parse_conv
from core.agent.responders import QuietResponder, safe_send
from core.agent.tasks import spawn as _spawn
from core.agent.turn import STOPPED_TEXT, Turn
from core.agent.workers import CronTakeover, SharedSettings, Workers
from core.audit import AuditLog
from core.chat import ApprovalRequest, ConversationKey, GrantScope, Inbound, Responder
from core.clock import Clock, SystemClock
from core.config import GoalsConfig
from core.cost.meter import Ledger
from core.errors import StoreError
from core.eventlog import EventLog
from core.fence import Fence
from core.messages import Message
from core.roles import Roles
from core.sandbox import site_for
from core.store import Store
from core.tools.base import Approver
from core.tools.delegation import Delegator
from core.triggers.kinds import THREAD_CHANNEL

log = logging.getLogger(__name__)

MAX_LANES = 1000  # conversations kept in memory; idle ones beyond it reload from the store


class Threads(Protocol):
    """The platform threads of trigger conversations (docs/triggers.md#one-thread-per-key):
    what the application (`bot.trigger_threads`) gives the agent."""

    async def responder(self, key: ConversationKey) -> Responder | None:
        """Where trigger conversation `key` posts: its platform thread, opened (with its
        header line) if it is not yet; None if it cannot be posted to here."""
        ...

    async def routed(self, inbound: Inbound) -> ConversationKey | None:
        """The trigger conversation a message in a platform thread belongs to, if any."""
        ...


def conv_id(key: ConversationKey) -> str:
    """The conversation key as one string: `slack:C0123:1700000000.0001`."""
    return ":".join(key)


class Agent:
    """One per process: lanes keyed by conversation, all sharing one store."""

    def __init__(
        self,
        store: Store,
        factory: ConversationFactory,
        *,
        events: EventLog | None = None,
        clock: Clock | None = None,
        approval_timeout: float = 300.0,
        responders: Callable[[ConversationKey], Responder | None] | None = None,
        goal_settings: GoalsConfig | None = None,
        max_queued: int = 20,
        shared: SharedSettings | None = None,
        worker_id: str | None = None,
        roles: Roles | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.store = store
        # Who may do what (docs/governance.md): without `[roles]`, the platforms'
        # approvers are admins and everyone else a member, as before roles existed.
        self.roles = roles or Roles(None, factory.approvers)
        self.audit = AuditLog(store)
        # What calls cost and the budgets that cap it (docs/cost.md; by default priced and
        # recorded, no budget enforced); refusals and changes are audited.
        self.ledger = ledger or Ledger(store)
        self.ledger.on_event = self.audit.budget_event
        self.max_queued = max_queued  # messages waiting per conversation; more are turned away
        self.factory = factory
        self.prefs = ProviderPrefs(store, factory)  # each channel's provider, kept
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
        self.approvals = ApprovalDesk(store, self.events, lambda: self._closing, self.audit)
        # The one dispatcher of the store's queue; with several workers on one store, with
        # their heartbeats and takeover (`core.agent.workers`).
        self.dispatcher: Dispatcher = (
            Workers(self, shared, worker_id) if shared is not None else Dispatcher(self)
        )
        self.cron: CronTakeover | None = None  # the scheduler, once the application has one
        # the triggers' platform threads (`bot.trigger_threads`), once the application has any
        self.threads: Threads | None = None

    @property
    def workers(self) -> Workers | None:
        """The dispatcher when several workers share the store; None in one process."""
        return self.dispatcher if isinstance(self.dispatcher, Workers) else None

    # --- input ------------------------------------------------------------------------

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        """Take a platform message in: a command acts at once; other text is stored as a
        queued run (before this returns, so before the platform hears "received") and
        answered in order. False if it was a duplicate delivery."""
        return await self._take_in(inbound, responder, None)

    async def responder_for(self, key: ConversationKey) -> Responder | None:
        """Where the agent posts into conversation `key` when no message of it is at
        hand: the channel's place, or a trigger conversation's platform thread (opened by
        the first post, docs/triggers.md)."""
        if key[0] == THREAD_CHANNEL:
            return await self.threads.responder(key) if self.threads is not None else None
        return self.responders(key)

    async def record_unreadable(self, channel: str, event_id: str, problem: str, raw: str) -> None:
        """`core.chat.AgentPort.record_unreadable`: the event and the seen mark go out in
        one commit, so a redelivery after a crash is recorded once."""
        if event_id and await self.store.seen(channel, event_id):
            return
        data = {"channel": channel, "id": event_id, "problem": problem, "raw": raw}
        self.events.emit("channel.event.unparsable", data)
        if event_id:
            await self.store.mark_seen(channel, event_id)  # flushes the event too
        else:
            await self.store.flush()

    async def run(self, inbound: Inbound, responder: Responder | None = None) -> RunReport:
        """Like `submit`, then wait for the message's run to end and report how it did.

        Text that starts no run (a command, a duplicate, a full queue, a shutdown) gets a
        "cancelled" report whose `stop_reason` says which."""
        done: asyncio.Future[RunReport] = asyncio.get_running_loop().create_future()
        await self._take_in(inbound, responder or QuietResponder(), done)
        return await done

    async def _take_in(
        self, inbound: Inbound, responder: Responder, done: asyncio.Future[RunReport] | None
    ) -> bool:
        if self._closing:  # not marked seen: a redelivery after the restart is answered
            await safe_send(responder, "Parley is restarting; please send that again soon.")
            _settle(done, _not_run("", "closing"))
            return True
        await self.dispatcher.start()  # claims (and joins the other workers) from first use
        # a reply in a trigger's thread belongs to the trigger's conversation
        if self.threads is not None and (inbound.thread_id or inbound.reply_to):
            routed = await self.threads.routed(inbound)
            inbound = inbound.routed_to(routed) if routed is not None else inbound
        event = (inbound.channel, inbound.event_id)
        if inbound.event_id:
            duplicate = event in self._taking_in  # checked and claimed with no await between
            self._taking_in.add(event)
            if duplicate or await self.store.seen(*event):
                if not duplicate:
                    self._taking_in.discard(event)
                self.events.emit("channel.event.duplicate", {"channel": event[0], "id": event[1]})
                _settle(done, _not_run("", "duplicate"))
                return False
        try:
            if (command := inbound.command) is None:
                if (lane := self.lanes.get(inbound.key)) is not None:
                    lane.answer_to(responder)  # its latest message came from there
                # Durable (a queued run, marked seen in the same commit) before the
                # platform hears "received": never lost nor answered twice.
                return await self.dispatcher.take_in(inbound, responder, done)
            lane = await self.lane(inbound.key)
            with lane.in_use():  # not evicted while the command acts
                lane.answer_to(responder)
                if inbound.event_id:
                    await self.store.mark_seen(*event)
                await self.commands.handle(lane, inbound, responder)
                if command[0] in _CHANGING:
                    self.dispatcher.changed(lane)
            _settle(done, _not_run("", "command"))
            return True
        finally:
            self._taking_in.discard(event)

    async def lane(self, key: ConversationKey, *, build: bool = True) -> Lane:
        """The lane of `key`, loaded from the store on first use (its conversation if `build`)."""
        if (lane := self.lanes.pop(key, None)) is not None:
            self.lanes[key] = lane  # most recently used last
            return lane
        lock = self._lane_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if (lane := self.lanes.get(key)) is not None:
                return lane
            conv = conv_id(key)
            store = self.store
            # one round of reads: a new conversation's first answer waits on them
            saved, row, goal, messages = await asyncio.gather(
                store.journal(conv),
                store.conversation(conv),
                store.goal(conv),
                store.load_messages(conv),
            )
            journal = JournalBox.from_data(
                saved, lambda j: store.save_journal(conv, j.model_dump())
            )
            lane = Lane(key, conv, journal)
            lane.restore(row, goal)
            if build:  # a cron job pins one of its own instead (`run_job`)
                await self.conversation_of(lane, messages)
            self.lanes[key] = lane
            self._evict_idle()
            return lane

    def _evict_idle(self) -> None:
        """At most `max_lanes` in memory: the least recently active idle ones go (the
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
        self.factory.refresh()  # between turns: configuration files edited since are read
        wanted = await self.provider_for(lane.key)
        chosen = await self.chosen_instructions(lane.key)
        if current is not None and lane.built_with(wanted, self.factory.generation, chosen):
            return current
        conversation = self.factory.conversation(wanted, lane.journal, key=lane.key)
        conversation.instructions = self.factory.guidance.instructions(lane.key[0], chosen)
        # Its tools' workspace from the start (each turn sets it again): the system message
        # names it, so a run resumed before any turn hashes the prompt it was started with.
        conversation.workspace = site_for(conversation.executor.ctx.sandbox, lane.conv_id).workspace
        conversation.messages = (
            messages if messages is not None else (current.messages if current else [])
        )
        lane.adopt(conversation, wanted, self.factory.generation, chosen)
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
        return await self.prefs.provider_for(key[0], key[1])

    async def chosen_instructions(self, key: ConversationKey) -> str | None:
        """The library file this chat's approvers chose (`/instructions set`), while it
        exists (the store is asked only when the library has files)."""
        library = self.factory.guidance.library
        if not library:
            return None
        name = await self.store.instruction_pref(key[0], key[1])
        return name if name in library else None

    def extra_system(self, lane: Lane) -> str:
        """The journal digest and the active goal, for the run's system message."""
        parts = []
        if digest := lane.journal.journal.digest():
            parts.append(f"Run journal (digest): {digest}")
        goal = lane.goal
        if goal is not None and goal.state == "active":
            parts.append(f"Active goal: {goal.text}")
        return "\n".join(parts)

    def holding(self, run_id: str) -> AbstractContextManager[Fence]:
        """`core.agent.turn.TurnHost.holding`: in one process, it always holds its runs."""
        return self.dispatcher.holding(run_id)

    def hands_over(self, key: ConversationKey) -> bool:
        """`core.agent.turn.TurnHost.hands_over`: with several workers, for the platforms'
        conversations (any worker answers them)."""
        return self.dispatcher.hands_over(key)

    def approver(self, lane: Lane, asker: str = "") -> Approver:
        """Asks through the lane's current responder, keyed by its run and the call, for
        `asker` (who the run answers, as the audit log names them)."""
        return LaneApprover(self.approvals, lane, lambda: self.approval_timeout, asker)

    def delegator(self, turn: Turn) -> Delegator | None:
        """The child runs `turn` may start with `delegate` (see `core.agent.children`)."""
        return delegator_for(self, turn)

    async def answer_approval(
        self, request_id: str, allow: bool, user_name: str, scope: GrantScope | None = None
    ) -> ApprovalRequest | None:
        """`core.chat.AgentPort.answer_approval`."""
        return await self.approvals.answer(request_id, allow, user_name, scope)

    async def approval_refused(
        self, request_id: str, channel: str, user_id: str, user_name: str, groups: Sequence[str]
    ) -> None:
        """`core.chat.AgentPort.approval_refused`."""
        roles = self.roles.of(channel, user_id, groups).names
        who = {"name": user_name, "roles": roles}
        await self.approvals.refused(request_id, f"{channel}:{user_id}", who)

    # --- runs ---------------------------------------------------------------------------

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
    ) -> RunReport | None:
        """Run one turn as the lane's run task (so `/stop` can cancel it alone); one run
        at a time per lane, whoever asks (the dispatcher, `/resume`, a cron job)."""
        if self._closing:
            return None
        async with lane.lock:
            turn = Turn(self, lane, responder, user_text, trigger, run_id, resume, inbound=inbound)
            task = asyncio.create_task(turn.run(), name=f"run {lane.conv_id}")
            lane.run_as(task)
            try:
                report = await asyncio.shield(task)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # the caller itself is cancelled
                    task.cancel()
                    await asyncio.wait({task})
                    raise
                # /stop reached the run before it began: it never ran, record that (and
                # say so: the run's own stream, which would, never started).
                if run_id is not None:
                    self.store.set_run_state(run_id, "cancelled", "stopped")
                lane.end_run("cancelled")
                report = _not_run(run_id or "", "cancelled")
                await safe_send(responder, STOPPED_TEXT)
            if self.lanes.get(lane.key) is lane:  # active just now: the last to evict
                self.lanes[lane.key] = self.lanes.pop(lane.key)
            self.dispatcher.run_ended(lane, report.run_id or None)
            return report

    async def cancel_running(self, key: ConversationKey) -> bool:
        """`core.chat.AgentPort.cancel_running`: stop the conversation's running run (the
        console's Ctrl-C); True if one was running."""
        lane = self.lanes.get(key)
        return lane is not None and await lane.stop()

    # --- autonomous goals ---------------------------------------------------------------

    def start_goal(self, lane: Lane, responder: Responder) -> None:
        """Drive the lane's goal without user input (`/goal create … --auto`)."""
        lane.drive_goal(_spawn(drive_goal(self, lane, responder), f"goal {lane.conv_id}"))

    # --- resume and reconcile ------------------------------------------------------------

    async def resume(self, lane: Lane, responder: Responder) -> str | None:
        """`/resume`: continue the lane's interrupted run (`core.agent.resuming.resume`);
        a message for the user if it cannot."""
        return await resuming.resume(self, lane, responder)

    async def skip(self, lane: Lane) -> str:
        """`/skip`: drop the lane's interrupted run (`core.agent.resuming.skip`)."""
        return await resuming.skip(self, lane)

    async def resume_run(
        self,
        lane: Lane,
        responder: Responder,
        run_id: str,
        *,
        anyway: bool = False,
        since: float = 0.0,
    ) -> str | None:
        """Continue run `run_id` in the lane, or say why it cannot safely go on
        (`core.agent.resuming.resume_run`)."""
        return await resuming.resume_run(self, lane, responder, run_id, anyway=anyway, since=since)

    async def reconcile(self) -> list[str]:
        """At start-up: what a crash or a restart left behind (see `core.agent.recovery`),
        then claim what is queued; with several workers, join them (`core.agent.workers`)."""
        return await self.dispatcher.recover()

    # --- lifecycle -----------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Until nothing queued here can be claimed and no run is running (tests)."""
        while True:
            workers = [lane.worker for lane in self.lanes.values() if lane.worker]
            busy = [w for w in workers if not w.done()]
            if busy:
                await asyncio.wait(busy)
            elif await self.dispatcher.idle():
                return

    async def settled(self, key: ConversationKey) -> None:
        """`channels.console.ConsoleAgent.settled`: until nothing taken in for `key` waits
        or runs."""
        while True:
            await self.dispatcher.settled(conv_id(key))
            lane = self.lanes.get(key)
            tasks = (lane.worker, lane.run_task) if lane is not None else ()
            busy = [t for t in tasks if t is not None and not t.done()]
            if not busy:
                return
            await asyncio.wait(busy)

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop taking input; let running turns reach a checkpoint (up to `grace`
        seconds), then cancel what is left (those runs stay resumable)."""
        self._closing = True
        self.dispatcher.stop_claiming()
        lanes = list(self.lanes.values())  # submits after this point are turned away
        for lane in lanes:
            await lane.stop_goal()
        running = [lane.worker for lane in lanes if lane.worker and not lane.worker.done()]
        if running:
            await asyncio.wait(running, timeout=grace)
        for lane in lanes:
            await lane.stop()
            if lane.worker and not lane.worker.done():
                lane.worker.cancel()
                await asyncio.wait({lane.worker})
        try:
            await self.audit.flush()
            await self.store.flush()
        except StoreError as exc:  # already logged as it failed: shut down all the same
            log.error("at shutdown: %s", exc)
        await self.dispatcher.close()  # what is queued stays: it runs after the restart


def _not_run(run_id: str, why: str) -> RunReport:
    """The report of a message that started no run (or a run stopped before it began)."""
    return RunReport(run_id, "cancelled", "", stop_reason=why)


def _settle(done: asyncio.Future[RunReport] | None, report: RunReport) -> None:
    if done is not None and not done.done():
        done.set_result(report)


_CHANGING = frozenset({"clear", "compact", "goal", "provider"})  # other workers reload


__all__ = [
    "MAX_LANES",
    "Agent",
    "Lane",
    "QuietResponder",
    "RunReport",
    "conv_id",
    "parse_conv",
]
