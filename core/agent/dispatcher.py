"""The one dispatcher (docs/durability.md#the-queue, docs/scale-out.md): the store's queue of
runs is the only queue, and one claim loop hands it out.

- Every message (and every turn of an autonomous goal) is a `queued` run in the store,
  committed before the platform hears "received"; nothing waits in memory but the
  future of whoever awaits the run (`Queued`), keyed by the run's id.
- The claim loop claims a conversation's oldest queued run once nothing of that
  conversation runs (`claim_queued_run`: one statement; on SQLite under the write lock),
  and runs it in the conversation's lane. It claims when woken: by a notice (`Notices`),
  by a run here that ended, or by a message taken in here. In one process the notices
  are an in-process event (`core.store.notify.LocalNotices`): a message taken in wakes
  the loop at once, with no polling.
- `/stop` cancels the conversation's queued runs in the store, and reaches a run claimed
  here that has not begun yet; `/status` counts the queued runs in the store.
- A shutdown stops claiming; what is still queued stays queued in the store and is
  claimed after the restart.

With several workers on one PostgreSQL store, `core.agent.workers.Workers` is this
dispatcher with heartbeats, takeover, the safety sweep and PostgreSQL's LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from core.agent.conversation import Conversation
from core.agent.intake import DispatchHost, Intake, Queued
from core.agent.journal import journal_of
from core.agent.lane import Lane, RunReport
from core.agent.recovery import parse_conv, reconcile
from core.agent.responders import safe_send
from core.agent.runs import sender_of
from core.agent.tasks import spawn
from core.agent.turn import STOPPED_TEXT
from core.chat import ConversationKey, Responder
from core.errors import StoreError
from core.fence import HELD, Fence, entered
from core.messages import Message
from core.store import RunRow
from core.store.notify import LocalNotices, Notices
from core.triggers.kinds import POST_KIND

log = logging.getLogger(__name__)

MAX_RUNS = 1000  # runs one process claims at once (one per conversation at most)


class Dispatcher(Intake):
    """The store's queue, handed out by one claim loop (see the module doc). `id` is the
    worker id the runs it claims are recorded with (None: one process, nobody's)."""

    def __init__(self, host: DispatchHost, *, max_runs: int = MAX_RUNS) -> None:
        self.host = host
        self.id: str | None = None
        self.max_runs = max_runs
        self.notices: Notices | None = None
        self.listening = asyncio.Event()
        self._wake = asyncio.Event()
        self._passed = asyncio.Event()  # a claim pass ended (`idle`)
        self._passes = (0, 0)  # claim passes begun, and the last one ended
        self._tasks: list[asyncio.Task[None]] = []
        self._claiming: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}  # claimed run id → its task here
        self._convs: dict[str, str] = {}  # claimed run id → its conversation
        self._starting: dict[str, str] = {}  # conversation → its claimed run, until it runs
        self._stopped: set[str] = set()  # conversations whose claimed run /stop reached early
        self._waiters: dict[str, Queued] = {}  # runs taken in here, until they start or end
        self._start: asyncio.Future[list[str]] | None = None

    # --- what differs with several workers (`Workers` overrides) --------------------------

    def shares(self, key: ConversationKey) -> bool:
        """Whether any worker may answer the conversation `key` (its queued runs are of no
        worker). In one process: every conversation is this process's."""
        return True

    def hands_over(self, key: ConversationKey) -> bool:
        """Whether a run of `key` cut off by a shutdown is left to the worker that takes
        it over (`core.agent.turn.TurnHost.hands_over`): never in one process."""
        return False

    def holding(self, run_id: str) -> AbstractContextManager[Fence]:
        """The fence of run `run_id` (`core.fence`): in one process it always holds."""
        return nullcontext(HELD)

    def changed(self, lane: Lane) -> None:
        """A command changed the conversation here (other workers load it again)."""

    async def _join(self) -> list[str]:
        """Start listening and claiming; the ids of runs taken over (none in one process)."""
        self.notices = LocalNotices()
        self._listen(self.notices)
        self._claiming = spawn(self._claim_loop(), "claim")
        self._wake.set()
        return []

    async def _refresh(self, lane: Lane, run_id: str) -> None:
        """Before a claimed run: load the lane again if another worker changed it."""

    async def _stop_elsewhere(self, lane: Lane) -> bool:
        """`/stop` beyond this process: whether a run on another worker was told to stop."""
        return False

    async def status(self, lane: Lane) -> str:
        """What `/status` says beyond this process (another worker's run); "" if nothing."""
        return ""

    async def _after_take(self, lane: Lane) -> None:
        """An interrupted run of `lane` was taken to go on (`take_resumable`)."""

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> list[str]:
        """Start (once): listen and claim. Returns the ids of the runs taken over."""
        failed = self._start is not None and self._start.done() and not self._start.cancelled()
        if failed and self._start is not None and self._start.exception() is not None:
            self._start = None  # the store was unreachable: try again
        first = self._start is None
        if self._start is None:
            self._start = asyncio.ensure_future(self._join())
        taken = await asyncio.shield(self._start)
        return taken if first else []

    async def recover(self) -> list[str]:
        """At start-up: what a crash or a restart left (`core.agent.recovery.reconcile`),
        then claim what is queued; the ids of the runs interrupted."""
        interrupted = await reconcile(self.host)
        await self.start()
        self._wake.set()  # runs that blocked their conversations are settled now
        return interrupted

    def _listen(self, notices: Notices) -> None:
        self._tasks.append(spawn(notices.listen(self._on_notice, self._on_listening), "notices"))

    def stop_claiming(self) -> None:
        """Shutdown: claim nothing more (the runs here go on until they end)."""
        if self._claiming is not None:
            self._claiming.cancel()

    async def close(self) -> None:
        """Stop claiming and listening; the runs claimed here that are still starting go
        back to the queue, and whoever awaits a run not begun hears "closing"."""
        self.stop_claiming()
        if self._start is not None and not self._start.done():
            self._start.cancel()
            await asyncio.wait({self._start})
        starting = [t for r, t in self._running.items() if r in self._starting.values()]
        tasks = [t for t in (*self._tasks, self._claiming, *starting) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for queued in self._waiters.values():
            queued.settle(RunReport(queued.run_id, "cancelled", "", stop_reason="closing"))
        self._waiters.clear()

    async def idle(self) -> bool:
        """Whether nothing runs here and a claim pass (waited for) found nothing to claim;
        else waits for what runs here and returns False."""
        if self._running:
            await asyncio.wait(set(self._running.values()))
            return False
        if self._claiming is None or self._claiming.done() or self.host.closing:
            return True
        wanted = self._passes[0] + 1  # a pass that begins after now
        self._wake.set()
        while not self._claiming.done():
            begun, ended = self._passes
            if ended >= wanted and begun == ended and not self._wake.is_set():
                break  # and no other pass is due
            self._passed.clear()
            await self._passed.wait()
        return not self._running

    async def settled(self, conv: str) -> None:
        """Until no run of `conv` taken in here waits to be claimed or runs as claimed."""
        while True:
            running = [t for r, t in self._running.items() if self._convs.get(r) == conv]
            if running:
                await asyncio.wait(running)
            elif any(":".join(q.inbound.key) == conv for q in self._waiters.values()):
                if self._claiming is None or self._claiming.done():
                    return  # nothing claims it here (a shutdown)
                self._passed.clear()
                self._wake.set()
                await self._passed.wait()
            else:
                return

    # --- claiming and running -------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            begun = self._passes[0] + 1
            self._passes = (begun, self._passes[1])
            while not self.host.closing and len(self._running) < self.max_runs:
                try:
                    row = await self._claim()
                except StoreError:
                    log.warning("claiming a queued run failed", exc_info=True)
                    break
                if row is None:
                    break
                # claimed here from now on: a /stop before the task begins reaches it
                self._starting[row.conv] = row.id
                task = spawn(self._run_claimed(row), f"run {row.id}")
                self._running[row.id], self._convs[row.id] = task, row.conv
                task.add_done_callback(self._finished)
            self._passes = (self._passes[0], begun)
            self._passed.set()

    async def _claim(self) -> RunRow | None:
        """One claim. A shutdown meanwhile waits for it and puts a claimed run back."""
        claim = asyncio.ensure_future(self._claim_statement())
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            with contextlib.suppress(StoreError):
                if (row := await claim) is not None:
                    await self.host.store.unclaim_run(row.id)
            raise

    async def _claim_statement(self) -> RunRow | None:
        return await self.host.store.claim_queued_run(self.id)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running = {k: t for k, t in self._running.items() if t is not task}
        self._convs = {k: c for k, c in self._convs.items() if k in self._running}
        self._wake.set()  # a slot is free

    async def _run_claimed(self, row: RunRow) -> None:
        """Run a run this dispatcher claimed, in its lane, answering through the responder
        it was taken in with (else the channel's, `host.responder_for`). A `post` run posts
        its text and ends (`_post`)."""
        run_id, conv, text = row.id, row.conv, row.text or ""
        host, key = self.host, parse_conv(conv)
        queued = self._waiters.pop(run_id, None)
        responder = queued.responder if queued is not None else await host.responder_for(key)
        if responder is None:
            host.store.set_run_state(run_id, "failed", "no channel to answer in")
            self.publish("ended", run_id)
            if queued is not None:
                queued.settle(RunReport(run_id, "failed", "", stop_reason="failed"))
            return
        fresh = key not in host.lanes
        self._starting[conv] = run_id
        if row.trigger == POST_KIND:
            await self._post(row, responder)
            return
        try:
            lane = await host.lane(key)
        except (StoreError, asyncio.CancelledError) as exc:  # a shutdown cancels it too
            self._starting.pop(conv, None)
            await host.store.unclaim_run(run_id)  # claimed again (here or elsewhere)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("run %s: its conversation did not load", run_id, exc_info=True)
            return
        # the message's sender is who the run answers (a goal's turn has none)
        inbound = queued.inbound if queued is not None and row.trigger == "user" else None
        if inbound is None and row.trigger == "user":  # taken in elsewhere, or before a restart
            inbound = await sender_of(host.store, row, key)  # their roles (docs/governance.md)
        report: RunReport | None = None
        try:
            with lane.in_use():  # not evicted while it runs here
                if not fresh:
                    await self._refresh(lane, run_id)
                lane.work(asyncio.current_task(), responder)
                self._starting.pop(conv, None)
                if conv in self._stopped:  # /stop came between the claim and now
                    self._stopped.discard(conv)
                    host.store.set_run_state(run_id, "cancelled", "stopped")
                    report = RunReport(run_id, "cancelled", "", stop_reason="cancelled")
                    host.events.emit("agent_run.cancelled", {"reason": "stopped"}, run_id=run_id)
                    await safe_send(responder, STOPPED_TEXT)
                    self.run_ended(lane, run_id)
                else:
                    report = await host.run_in_lane(
                        lane,
                        responder,
                        user_text=text,
                        trigger=row.trigger,
                        run_id=run_id,
                        inbound=inbound,
                    )
        finally:
            self._starting.pop(conv, None)
            if report is None:  # never began (a shutdown): back to the queue
                await host.store.unclaim_run(run_id)
                if queued is not None:
                    self._waiters[run_id] = queued
        if report is not None and queued is not None:
            queued.settle(report)

    async def _post(self, row: RunRow, responder: Responder) -> None:
        """A run that posts its text as it is (a trigger's `deliver_only` message, the line
        that closes its thread): no model call. Posted, then recorded in the conversation's
        history as the assistant's, so a person who replies is answered knowing it. A crash
        before it is recorded posts it again after the restart (at least once)."""
        host, text = self.host, row.text or ""
        try:
            with self.holding(row.id) as fence, entered(fence):
                await responder.send(text)
        except Exception as exc:  # a platform that refused it: the run says so
            log.warning("run %s: the post was not delivered: %s", row.id, exc)
            host.store.set_run_state(row.id, "failed", f"not delivered: {exc}"[:500])
        else:
            lane = await host.lane(parse_conv(row.conv))
            conversation = lane.conversation
            if conversation is not None:
                conversation.messages.append(Message.assistant(text))
                last = len(conversation.messages) - 1
                host.store.save_messages(row.conv, conversation.messages, [last], shrunk=False)
            host.store.set_run_state(row.id, "completed", "posted")
        finally:
            self._starting.pop(row.conv, None)
        await host.store.flush()
        self.publish("ended", row.id)
        self._wake.set()

    def run_ended(self, lane: Lane, run_id: str | None) -> None:
        """A run here ended: its conversation's next run may be claimed (here or by
        another worker), and whoever awaits it hears."""
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

    def spawn_run(
        self, run_id: str, work: Coroutine[Any, Any, None], name: str
    ) -> asyncio.Task[None] | None:
        """Run `work` for run `run_id` here as one of the runs claimed here (a slot while
        it lasts), unless something of that run already runs here; its task, if started."""
        if run_id in self._running:
            work.close()
            return None
        task = spawn(work, name)
        self._running[run_id] = task
        task.add_done_callback(self._finished)
        return task

    async def reload(self, lane: Lane) -> Conversation:
        """The lane's history, journal, totals and goal, as the store has them."""
        store, conv = self.host.store, lane.conv_id
        journal = journal_of(await store.journal(conv))
        row = await store.conversation(conv)
        lane.restore(row, await store.goal(conv), journal)
        conversation = await self.host.conversation_of(lane)
        conversation.messages = await store.load_messages(conv)
        lane.loaded()
        return conversation

    # --- /stop, /status and /resume -------------------------------------------------------

    async def waiting(self, lane: Lane) -> tuple[bool, int]:
        """`/status`: whether a run of the lane's conversation is claimed (by any worker,
        its turn maybe not begun yet), and how many are queued."""
        rows = await self.host.store.runs(
            conv=lane.conv_id, states=["queued", "running"], limit=1000
        )
        queued = sum(row.state == "queued" for row in rows)
        return queued < len(rows), queued

    async def stop(self, lane: Lane) -> tuple[int, bool]:
        """`/stop`: cancel the conversation's queued runs (wherever they were taken in),
        stop a run claimed here that has not begun, and one running on another worker.
        How many were dropped, and whether a run not in the lane was stopped."""
        dropped = await self.host.store.cancel_queued(lane.conv_id, "dropped by /stop")
        for run_id in dropped:
            queued = self._waiters.pop(run_id, None)
            if queued is not None:
                queued.settle(RunReport(run_id, "cancelled", "", stop_reason="dropped"))
            self.publish("ended", run_id)
        early = lane.conv_id in self._starting
        if early:
            self._stopped.add(lane.conv_id)
        return len(dropped), await self._stop_elsewhere(lane) or early

    async def take_resumable(self, lane: Lane, run_id: str, since: float = 0.0) -> str | None:
        """`/resume` (or `/skip`): take the interrupted run through the store, so that
        nothing else of its conversation runs (nor another worker goes on with it too);
        a message for the user if it cannot be taken. Queued runs created before `since`
        do not hold it (recovery: they were queued before the restart, and go after)."""
        if not await self.host.store.take_resumable_run(run_id, self.id, since=since):
            return (
                "That run is already going on, or a message is waiting here; try again once "
                "it is answered."
            )
        await self._after_take(lane)
        return None

    # --- notices --------------------------------------------------------------------------

    def publish(self, topic: str, payload: str) -> None:
        """Tell the dispatcher (and every worker: `core.store.notify`)."""
        if self.notices is not None:
            self.notices.publish_soon(topic, payload)

    def _on_notice(self, topic: str, payload: str) -> None:
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
            lane = self.host.lanes.get(parse_conv(payload))
            if lane is not None:
                spawn(_stop_lane(lane), f"stop {payload}")

    def _on_listening(self) -> None:
        self.listening.set()
        self._wake.set()

    async def _settle_from_store(self, queued: Queued) -> None:
        row = await self.host.store.run(queued.run_id)
        if row is not None:
            queued.settle(RunReport.of_row(row))


async def _stop_lane(lane: Lane) -> None:
    await lane.stop()
    await lane.stop_goal()


__all__ = ["MAX_RUNS", "DispatchHost", "Dispatcher", "Queued"]
