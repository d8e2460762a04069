"""Several workers on one PostgreSQL store (docs/scale-out.md): the dispatcher's shared mode.

`Workers` is the one dispatcher (`core.agent.dispatcher`) with what only a shared store
needs switched on:

- a platform conversation's queued run is of no worker (`shares`), so whichever worker is
  free claims it — the conversation's oldest, only while nothing of it runs anywhere —
  builds the lane (loaded again from the store if another worker ran or changed the
  conversation since) and answers through the channel's responder for it
  (`agent.responders(key)`: every worker has every channel's outbound side); the
  terminal's conversations stay the taking worker's own;
- the notices are PostgreSQL's LISTEN/NOTIFY; a safety sweep every `sweep` seconds claims
  what a lost notice left queued and looks for dead workers;
- `/stop` also tells the worker whose run it is (`NOTIFY stop`); an approval answered on
  one worker wakes the run waiting on another (`core.agent.approvals`);
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

from core.agent.dispatcher import Dispatcher, DispatchHost, Queued
from core.agent.lane import Lane
from core.agent.liveness import Liveness, RunFence
from core.agent.recovery import parse_conv
from core.agent.shared import SharedSettings as SharedSettings
from core.agent.shared import new_worker_id
from core.agent.takeover import CronTakeover, Takeovers
from core.agent.tasks import spawn
from core.chat import ConversationKey
from core.errors import ConfigError, StoreError
from core.sandbox import kill_leftovers
from core.store import RunRow, SharedStore
from core.store.notify import open_notices

log = logging.getLogger(__name__)

WorkerHost = DispatchHost  # what the shared mode needs of the agent


class Workers(Dispatcher):
    """The shared mode of one agent's dispatcher: its worker id, heartbeats, notices
    between workers and the takeover of dead workers' runs."""

    id: str  # this worker's (`new_worker_id`)

    def __init__(
        self, host: WorkerHost, settings: SharedSettings, worker_id: str | None = None
    ) -> None:
        super().__init__(host, max_runs=settings.max_runs)
        self.settings = settings
        self.id = worker_id or new_worker_id()
        self.machine = self.id.split(":", 1)[0]
        host.store.set_worker(self.id)
        self.liveness = Liveness(self.shared_store, self.id, settings.timeout)
        self.takeovers = Takeovers(self)
        self.sweeps = 0  # sweeps done (for status and tests)
        self.listens = 0  # times listening (re)started

    @property
    def shared_store(self) -> SharedStore:
        """The store, as what only a shared store does (`core.store.SharedStore`).

        Raises:
            ConfigError: the store is not one several workers can share (SQLite).
        """
        store = self.host.store
        if not isinstance(store, SharedStore):
            raise ConfigError(
                "store.url",
                "several workers need a store they can share, and this one is SQLite",
                'set `url = "postgresql://USER@HOST:5432/DATABASE"` in [store], or run one worker',
            )
        return store

    def shares(self, key: ConversationKey) -> bool:
        return key[0] in self.settings.channels

    def hands_over(self, key: ConversationKey) -> bool:
        return self.shares(key)

    # --- lifecycle ------------------------------------------------------------------------

    async def _join(self) -> list[str]:
        """Join the workers: beat, listen, take over what a dead worker (or a single
        process before) left running, and claim what is queued. Returns the ids of the
        runs taken over."""
        for task in self._tasks:  # of an earlier attempt that failed halfway
            task.cancel()
        self._tasks = []
        await self.liveness.beat()
        self.notices = await open_notices(self.host.store)
        self.host.approvals.notices = self.notices
        self._listen(self.notices)
        self._tasks.append(spawn(self._beat(), "heartbeat"))
        try:
            await asyncio.wait_for(self.listening.wait(), timeout=10)
        except TimeoutError:
            log.warning("not listening for notices yet; the sweep claims queued runs")
        taken: list[str] = []
        if self.settings.channels:
            # `parley chat` and the like beat (their own runs are taken over if they
            # die) but take nothing over: they cannot answer on the platforms.
            # Runs of no worker: a single process's, from before this database was shared.
            taken = await self.takeovers.take_over(None, created_before=self.host.started_at)
            taken += await self._sweep()
            self._tasks.append(spawn(self._sweeping(), "sweep"))
        self._claiming = spawn(self._claim_loop(), "claim")
        self._wake.set()
        return taken

    async def recover(self) -> list[str]:
        """Join the workers: a dead worker's runs are taken over, not reconciled."""
        return await self.start()

    async def _claim_statement(self) -> RunRow | None:
        # the worker's own queued runs (the terminal's), and — if it serves the
        # platforms — those of no worker
        shared = bool(self.settings.channels)
        return await self.host.store.claim_queued_run(self.id, shared=shared)

    async def _create(self, queued: Queued, conv: str, shared: bool) -> bool:
        inbound = queued.inbound
        if not (shared and inbound.event_id):
            return await super()._create(queued, conv, shared)
        # Of several workers taking one event in at once (a redelivery), one stores it.
        return await self.shared_store.create_queued_run(
            queued.run_id, conv, inbound.text, channel=inbound.channel, event_id=inbound.event_id
        )

    def changed(self, lane: Lane) -> None:
        """A command changed the conversation here: other workers load it again."""
        self.publish("conv", f"{self.id} {lane.conv_id}")

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

    async def _after_take(self, lane: Lane) -> None:
        async with lane.lock:  # as the store has it: another worker may have run it
            await self.reload(lane)

    # --- /stop and /status ----------------------------------------------------------------

    async def _stop_elsewhere(self, lane: Lane) -> bool:
        """Unless the run is this worker's, tell every worker to stop it."""
        if not self.shares(lane.key):
            return False
        elsewhere = await self._running_elsewhere(lane)
        assert self.notices is not None
        await self.notices.publish("stop", lane.conv_id)  # a goal driver elsewhere stops too
        return elsewhere is not None

    async def status(self, lane: Lane) -> str:
        """`/status`: the conversation's run on another worker and its queued messages."""
        if not self.shares(lane.key):
            return ""
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

    # --- notices --------------------------------------------------------------------------

    def _on_notice(self, topic: str, payload: str) -> None:
        host = self.host
        if topic == "approval":
            spawn(host.approvals.answered_elsewhere(payload), f"approval {payload}")
        elif topic == "conv":
            sender, _, conv = payload.partition(" ")
            lane = host.lanes.get(key := parse_conv(conv))
            if sender != self.id:
                host.prefs.forget(key[0], key[1])  # it may have been a /provider
            if lane is not None and sender != self.id:
                lane.mark_stale()
        else:
            super()._on_notice(topic, payload)

    def _on_listening(self) -> None:
        """Listening (again): notices sent meanwhile were missed, so every lane may be
        stale and queued runs may wait."""
        for lane in self.host.lanes.values():
            lane.mark_stale()
        self.host.prefs.forget_all()
        self.listens += 1
        super()._on_listening()

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
        for dead in await self.shared_store.dead_workers(self.settings.timeout):
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


__all__ = ["CronTakeover", "SharedSettings", "WorkerHost", "Workers", "new_worker_id"]
