"""Several workers on one PostgreSQL store (docs/scale-out.md): the agent's shared mode.

In one process (SQLite) a conversation's messages wait in its lane's queue in memory. With
several `parley run` workers on one PostgreSQL every promise must hold across them, so in
shared mode:

- a message is stored as a `queued` run (as always) and announced (`NOTIFY queued`); it is
  not queued in memory. Whichever worker is free claims it (`claim_queued_run`: a
  conversation's oldest queued run, only while nothing of it runs anywhere), builds the
  lane — loaded again from the store if another worker ran or changed the conversation
  since — and answers through the channel's responder for that conversation
  (`agent.responders(key)`: every worker has every channel's outbound side);
- a worker wakes on a notice, not by polling; a safety sweep every `sweep` seconds claims
  what a lost notice left queued and looks for dead workers;
- `/stop` drops the conversation's queued runs in the store and tells the worker whose run
  it is (`NOTIFY stop`); an approval answered on one worker wakes the run waiting on
  another (`core.agent.approvals`); `/resume` takes the interrupted run through the store,
  so two workers cannot both go on with it;
- every worker beats (`worker_heartbeat`) every `heartbeat` seconds; one not heard from for
  `timeout` seconds is dead: one live worker takes its running runs over atomically
  (`take_over_runs`, which also strikes the dead worker off) and goes on with each before
  anything else of its conversation (`core.agent.takeover`): resumed at once where that is
  safe, else the conversation pauses until `/resume` or `/skip`. A cron fire it left is
  the scheduler's to go on with or report (`CronTakeover`). Its queued runs were never its
  own;
- a worker that was only silent (a long pause) and goes on afterwards does nothing more
  for the runs taken from it: every platform call of a run, and every write of its
  history, is fenced (`core.agent.liveness`, `core.fence`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

from core.agent.approvals import ApprovalDesk
from core.agent.conversation import Conversation
from core.agent.journal import RunJournal
from core.agent.lane import Lane, Queued, RunReport
from core.agent.liveness import Liveness, RunFence
from core.agent.prefs import ProviderPrefs
from core.agent.recovery import parse_conv
from core.agent.responders import safe_send
from core.agent.runs import sender_of
from core.agent.shared import SharedSettings as SharedSettings
from core.agent.shared import new_worker_id
from core.agent.takeover import CronTakeover, TakeoverHost, Takeovers
from core.agent.tasks import spawn
from core.agent.turn import new_run_id
from core.chat import ConversationKey, Inbound, Responder
from core.errors import StoreError
from core.store import RunRow
from core.store.notify import Notices, open_notices
from core.tools.reaper import kill_leftovers

log = logging.getLogger(__name__)


class WorkerHost(TakeoverHost, Protocol):
    """What the shared mode needs of the agent."""

    lanes: dict[ConversationKey, Lane]
    prefs: ProviderPrefs
    approvals: ApprovalDesk


class Workers:
    """The shared mode of one agent: its worker id, heartbeats, notices, the claim loop
    and the takeover of dead workers' runs."""

    def __init__(
        self, host: WorkerHost, settings: SharedSettings, worker_id: str | None = None
    ) -> None:
        self.host, self.settings = host, settings
        self.id = worker_id or new_worker_id()
        self.machine = self.id.split(":", 1)[0]
        host.store.set_worker(self.id)
        self.liveness = Liveness(host.store, self.id, settings.timeout)
        self.takeovers = Takeovers(self)
        self.notices: Notices | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._claiming: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}  # claimed run id → its task here
        self._starting: dict[str, str] = {}  # conversation → its claimed run, until it runs
        self._stopped: set[str] = set()  # conversations whose claimed run /stop reached early
        self._waiters: dict[str, Queued] = {}  # runs taken in here, until they start or end
        self.listening = asyncio.Event()
        self.sweeps = 0  # sweeps done (for status and tests)
        self.listens = 0  # times listening (re)started
        self._start: asyncio.Task[list[str]] | None = None

    def shares(self, key: ConversationKey) -> bool:
        """Whether any worker may answer the conversation `key`."""
        return key[0] in self.settings.channels

    async def start(self) -> list[str]:
        """Join the workers (once; see `_join`); the ids of the runs taken over."""
        failed = self._start is not None and self._start.done() and not self._start.cancelled()
        if failed and self._start is not None and self._start.exception() is not None:
            self._start = None  # the store was unreachable: try again
        first = self._start is None
        if self._start is None:
            self._start = asyncio.ensure_future(self._join())
        taken = await asyncio.shield(self._start)
        return taken if first else []

    # --- lifecycle ------------------------------------------------------------------------

    async def _join(self) -> list[str]:
        """Join the workers: beat, listen, take over what a dead worker (or a single
        process before) left running, and claim what is queued. Returns the ids of the
        runs taken over."""
        store = self.host.store
        for task in self._tasks:  # of an earlier attempt that failed halfway
            task.cancel()
        await self.liveness.beat()
        self.notices = await open_notices(store)
        self.host.approvals.notices = self.notices
        self._tasks = [
            spawn(self.notices.listen(self._on_notice, self._on_listening), "notices"),
            spawn(self._beat(), "heartbeat"),
        ]
        try:
            await asyncio.wait_for(self.listening.wait(), timeout=10)
        except TimeoutError:
            log.warning("not listening for notices yet; the sweep claims queued runs")
        if not self.settings.channels:
            # `parley chat` and the like: they beat (their own runs are taken over if they
            # die) but take nothing over nor claim: they cannot answer on the platforms.
            return []
        # Runs of no worker: a single process's, from before this database was shared.
        taken = await self.takeovers.take_over(None, created_before=self.host.started_at)
        taken += await self._sweep()
        self._tasks.append(spawn(self._sweeping(), "sweep"))
        self._claiming = spawn(self._claim_loop(), "claim")
        self._wake.set()
        return taken

    def stop_claiming(self) -> None:
        """Shutdown: claim nothing more (heartbeats go on until the runs here end)."""
        if self._claiming is not None:
            self._claiming.cancel()

    async def close(self) -> None:
        """Stop beating and listening. The worker's row stays until another worker finds
        it silent (and finds nothing left running)."""
        self.stop_claiming()
        if self._start is not None and not self._start.done():
            self._start.cancel()
            await asyncio.wait({self._start})
        # and the runs claimed here still starting (not yet a lane's worker: a shutdown
        # did not see them); they go back to the queue
        starting = [t for r, t in self._running.items() if r in self._starting.values()]
        tasks = [t for t in (*self._tasks, self._claiming, *starting) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for queued in self._waiters.values():
            queued.settle(RunReport(queued.run_id, "cancelled", "", stop_reason="closing"))
        self._waiters.clear()

    # --- input ----------------------------------------------------------------------------

    async def take_in(
        self,
        inbound: Inbound,
        responder: Responder,
        done: asyncio.Future[RunReport] | None,
    ) -> bool:
        """Text: a queued run in the store, announced to every worker."""
        store, conv = self.host.store, ":".join(inbound.key)
        waiting = await store.runs(conv=conv, states=["queued"], limit=self.host.max_queued)
        if len(waiting) >= self.host.max_queued:
            return await self._turn_away(inbound, responder, conv, len(waiting), done)
        queued = Queued(inbound, responder, new_run_id(), done)
        if inbound.user_id:  # committed with the run: whoever claims it knows the sender
            store.add_sender(queued.run_id, inbound.user_id, inbound.user_name, inbound.groups)
        if not inbound.event_id:
            await self.enqueue(queued)
            return True
        if not await store.create_queued_run(
            queued.run_id, conv, inbound.text, channel=inbound.channel, event_id=inbound.event_id
        ):  # another worker took the same event in meanwhile (a redelivery)
            event = {"channel": inbound.channel, "id": inbound.event_id}
            self.host.events.emit("channel.event.duplicate", event)
            queued.settle(RunReport("", "cancelled", "", stop_reason="duplicate"))
            return False
        self._announce(queued, conv)
        return True

    async def enqueue(self, queued: Queued, trigger: str = "user") -> None:
        """`queued` as a queued run in the store, announced to every worker; it hears how
        the run ended, wherever it ran (a goal's turns queue so too: `core.agent.goals`)."""
        conv = ":".join(queued.inbound.key)
        await self.host.store.create_run(
            queued.run_id, conv, trigger, state="queued", text=queued.inbound.text, shared=True
        )
        self._announce(queued, conv)

    def _announce(self, queued: Queued, conv: str) -> None:
        self._waiters[queued.run_id] = queued
        self.publish("queued", conv)
        self._wake.set()

    async def withdraw(self, queued: Queued, reason: str) -> None:
        """`queued`'s run leaves the queue unless a worker claimed it already."""
        self._waiters.pop(queued.run_id, None)
        conv = ":".join(queued.inbound.key)
        if await self.host.store.cancel_queued(conv, reason, run_id=queued.run_id):
            self.publish("ended", queued.run_id)

    async def _turn_away(
        self,
        inbound: Inbound,
        responder: Responder,
        conv: str,
        waiting: int,
        done: asyncio.Future[RunReport] | None,
    ) -> bool:
        if inbound.event_id:
            await self.host.store.mark_seen(inbound.channel, inbound.event_id)
        if done is not None and not done.done():
            done.set_result(RunReport("", "cancelled", "", stop_reason="queue_full"))
        self.host.events.emit("agent.queue.full", {"queued": waiting}, conv=conv)
        await safe_send(
            responder,
            f"I already have {waiting} messages waiting in this conversation, so I did not "
            "queue that one. Send it again once I have caught up (/stop drops the queue).",
        )
        return True

    def changed(self, lane: Lane) -> None:
        """A command changed the conversation here: other workers load it again."""
        self.publish("conv", f"{self.id} {lane.conv_id}")

    # --- claiming and running -------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not self.host.closing and len(self._running) < self.settings.max_runs:
                try:
                    row = await self._claim()
                except StoreError:
                    log.warning("claiming a queued run failed", exc_info=True)
                    break
                if row is None:
                    break
                task = spawn(self._run_claimed(row), f"run {row.id}")
                self._running[row.id] = task
                task.add_done_callback(self._finished)

    async def _claim(self) -> RunRow | None:
        """One claim. A shutdown meanwhile waits for it and puts a claimed run back."""
        claim = asyncio.ensure_future(self.host.store.claim_queued_run(self.id))
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            with contextlib.suppress(StoreError):
                if (row := await claim) is not None:
                    await self.host.store.unclaim_run(row.id)
            raise

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running = {k: t for k, t in self._running.items() if t is not task}
        self._wake.set()  # a slot is free

    async def _run_claimed(self, row: RunRow) -> None:
        """Run a run this worker claimed, in its lane, answering through the channel."""
        run_id, conv, text = row.id, row.conv, row.text or ""
        host, key = self.host, parse_conv(conv)
        queued = self._waiters.pop(run_id, None)
        responder = queued.responder if queued is not None else host.responders(key)
        if responder is None:
            host.store.set_run_state(run_id, "failed", "no channel to answer in")
            self.publish("ended", run_id)
            if queued is not None:
                queued.settle(RunReport(run_id, "failed", "", stop_reason="failed"))
            return
        fresh = key not in host.lanes
        self._starting[conv] = run_id
        try:
            lane = await host.lane(key)
        except (StoreError, asyncio.CancelledError) as exc:  # a shutdown cancels it too
            self._starting.pop(conv, None)
            await host.store.unclaim_run(run_id)  # another worker (or this one) tries again
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("run %s: its conversation did not load", run_id, exc_info=True)
            return
        report: RunReport | None = None
        try:
            with lane.in_use():  # not evicted while it runs here
                inbound = queued.inbound if queued else await sender_of(host.store, row, key)
                if not fresh:
                    await self._refresh(lane, run_id)
                lane.work(asyncio.current_task(), responder)
                self._starting.pop(conv, None)
                if conv in self._stopped:  # /stop came between the claim and now
                    self._stopped.discard(conv)
                    host.store.set_run_state(run_id, "cancelled", "stopped")
                    report = RunReport(run_id, "cancelled", "", stop_reason="cancelled")
                    host.events.emit("agent_run.cancelled", {"reason": "stopped"}, run_id=run_id)
                    self.run_ended(lane, run_id)
                else:
                    report = await host.run_in_lane(
                        lane,
                        responder,
                        user_text=text,
                        trigger=row.trigger,
                        run_id=run_id,
                        inbound=inbound,  # its sender: their roles (docs/governance.md)
                    )
        finally:
            self._starting.pop(conv, None)
            if report is None:  # never began (a shutdown): back to the queue for another
                await host.store.unclaim_run(run_id)
                if queued is not None:
                    self._waiters[run_id] = queued
        if report is not None and queued is not None:
            queued.settle(report)

    def run_ended(self, lane: Lane, run_id: str | None) -> None:
        """Any run of this worker ended: its conversation's next run may be claimed, by
        this worker or another, and whoever awaits it hears."""
        if run_id is not None:
            lane.saw_run(run_id)
            self.publish("ended", run_id)
        self._wake.set()

    @contextlib.contextmanager
    def starting(self, conv: str, run_id: str) -> Iterator[Callable[[], bool]]:
        """While run `run_id` of `conv` gets going here: a `/stop` meanwhile is kept, and
        the callable says (once the run is about to go) whether one came."""
        self._starting[conv] = run_id

        def stopped() -> bool:
            self._starting.pop(conv, None)
            came = conv in self._stopped
            self._stopped.discard(conv)
            return came

        try:
            yield stopped
        finally:
            self._starting.pop(conv, None)

    def holding(self, run_id: str) -> contextlib.AbstractContextManager[RunFence]:
        """The fence of run `run_id` of this worker while inside (`core.agent.liveness`)."""

        async def still_mine() -> bool:
            row = await self.host.store.run(run_id)
            return row is not None and row.worker == self.id and row.state != "queued"

        return self.liveness.holding(run_id, still_mine)

    async def _refresh(self, lane: Lane, run_id: str) -> None:
        """Load the lane again if another worker ran or changed its conversation since
        this one last did."""
        recent = await self.host.store.runs(conv=lane.conv_id, limit=self.host.max_queued + 10)
        latest = next((r.id for r in recent if r.id != run_id and r.state != "queued"), None)
        if lane.stale or latest != lane.seen_run:
            async with lane.lock:
                await self.reload(lane)
            lane.saw_run(latest)

    async def reload(self, lane: Lane) -> Conversation:
        """The lane's history, journal, totals and goal, as the store has them."""
        store, conv = self.host.store, lane.conv_id
        data = await store.journal(conv)
        journal = RunJournal.model_validate(data) if data else RunJournal()
        row = await store.conversation(conv)
        lane.restore(row, await store.goal(conv), journal)
        conversation = await self.host.conversation_of(lane)
        conversation.messages = await store.load_messages(conv)
        lane.loaded()
        return conversation

    # --- /stop and /resume ----------------------------------------------------------------

    async def stop_elsewhere(self, lane: Lane) -> tuple[int, bool]:
        """`/stop`: drop the conversation's queued runs (wherever they were taken in) and,
        unless the run is this worker's, tell every worker to stop it."""
        dropped = await self.host.store.cancel_queued(lane.conv_id, "dropped by /stop")
        for run_id in dropped:
            queued = self._waiters.pop(run_id, None)
            if queued is not None:
                queued.settle(RunReport(run_id, "cancelled", "", stop_reason="dropped"))
            self.publish("ended", run_id)
        elsewhere = await self._running_elsewhere(lane)
        assert self.notices is not None
        await self.notices.publish("stop", lane.conv_id)  # a goal driver elsewhere stops too
        return len(dropped), elsewhere is not None

    async def status(self, lane: Lane) -> str:
        """`/status`: the conversation's run on another worker and its queued messages."""
        running = await self._running_elsewhere(lane)
        store = self.host.store
        queued = await store.runs(conv=lane.conv_id, states=["queued"], limit=1000)
        parts = [f"running on {running.worker} (run {running.id})"] if running else []
        waiting = await store.runs(conv=lane.conv_id, states=["waiting_on_human"], limit=1)
        if waiting and waiting[0].resumable:
            parts.append(f"run {waiting[0].id} was interrupted and waits for /resume or /skip")
        if queued:
            parts.append(f"{len(queued)} queued")
        return ", ".join(parts)

    async def _running_elsewhere(self, lane: Lane) -> RunRow | None:
        """The conversation's running run, when it is not this worker's."""
        if lane.busy:
            return None
        rows = await self.host.store.runs(conv=lane.conv_id, states=["running"], limit=1)
        return rows[0] if rows else None

    async def take_resumable(self, lane: Lane, run_id: str) -> str | None:
        """`/resume` here: take the interrupted run through the store (so no other worker
        goes on with it too) and load the lane as the store has it; a message for the
        user if the run cannot be taken."""
        if not await self.host.store.take_resumable_run(run_id, self.id):
            return (
                "That run is already going on, or a message is waiting here; try again once "
                "it is answered."
            )
        async with lane.lock:
            await self.reload(lane)
        return None

    # --- notices --------------------------------------------------------------------------

    def publish(self, topic: str, payload: str) -> None:
        """Tell every worker (`core.store.notify`)."""
        if self.notices is not None:
            self.notices.publish_soon(topic, payload)

    def _on_notice(self, topic: str, payload: str) -> None:
        host = self.host
        if topic == "queued":
            self._wake.set()
        elif topic == "ended":
            self._wake.set()
            queued = self._waiters.pop(payload, None)
            if queued is not None and queued.done is not None:
                spawn(self._settle_from_store(queued), f"report {payload}")
        elif topic == "stop":
            if payload in self._starting:
                self._stopped.add(payload)
            lane = host.lanes.get(parse_conv(payload))
            if lane is not None:
                spawn(_stop_lane(lane), f"stop {payload}")
        elif topic == "approval":
            spawn(host.approvals.answered_elsewhere(payload), f"approval {payload}")
        elif topic == "conv":
            sender, _, conv = payload.partition(" ")
            lane = host.lanes.get(key := parse_conv(conv))
            if sender != self.id:
                host.prefs.forget(key[0], key[1])  # it may have been a /provider
            if lane is not None and sender != self.id:
                lane.mark_stale()

    def _on_listening(self) -> None:
        """Listening (again): notices sent meanwhile were missed, so every lane may be
        stale and queued runs may wait."""
        for lane in self.host.lanes.values():
            lane.mark_stale()
        self.host.prefs.forget_all()
        self.listens += 1
        self.listening.set()
        self._wake.set()

    async def _settle_from_store(self, queued: Queued) -> None:
        row = await self.host.store.run(queued.run_id)
        if row is not None:
            queued.settle(RunReport.of_row(row))

    # --- heartbeats and dead workers ------------------------------------------------------

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat)
            try:
                await self.liveness.beat()
            except StoreError:
                log.warning("heartbeat of %s failed", self.id, exc_info=True)

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep)
            try:
                await self._sweep()
            except StoreError:
                log.warning("the sweep for dead workers failed", exc_info=True)
            self.sweeps += 1
            self._wake.set()  # what a lost notice left queued

    async def _sweep(self) -> list[str]:
        """Take over the runs of workers not heard from for `timeout` seconds (and go on
        with them, and with any taken over before that is not going on here yet), the
        fires of dead workers, and kill the tool process groups that dead workers of this
        machine left."""
        store, taken = self.host.store, []
        for dead in await store.dead_workers(self.settings.timeout):
            if dead == self.id:
                continue
            runs = await self.takeovers.take_over(dead, silent_for=self.settings.timeout)
            self.host.events.emit("agent.worker.dead", {"worker": dead, "runs": len(runs)})
            taken += runs
        await self.takeovers.go_on_held()
        if self.host.cron is not None:
            await self.host.cron.take_over_fires()
        groups = await store.take_tool_groups(host=self.machine, stale=self.settings.timeout)
        if killed := kill_leftovers(groups):
            self.host.events.emit("agent.tool_groups_killed", {"count": killed})
        return taken

    def spawn_run(self, run_id: str, work: Coroutine[Any, Any, None], name: str) -> bool:
        """Run `work` for run `run_id` here as one of this worker's runs (a slot while it
        lasts), unless something of that run already runs here; whether it was started."""
        if run_id in self._running:
            work.close()
            return False
        task = spawn(work, name)
        self._running[run_id] = task
        task.add_done_callback(self._finished)
        return True


async def _stop_lane(lane: Lane) -> None:
    await lane.stop()
    await lane.stop_goal()


__all__ = ["CronTakeover", "SharedSettings", "WorkerHost", "Workers", "new_worker_id"]
