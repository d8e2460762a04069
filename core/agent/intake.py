"""Taking text in (docs/durability.md#the-queue): a message becomes a queued run in the
store, committed before the platform hears "received", and the dispatcher
(`core.agent.dispatcher`) is told. Whoever awaits the run waits on a `Queued`, keyed by
the run's id; a full queue turns the message away and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Protocol

from core.agent.approvals import ApprovalDesk
from core.agent.lane import Lane, RunReport
from core.agent.prefs import ProviderPrefs
from core.agent.responders import safe_send
from core.agent.takeover import TakeoverHost
from core.agent.turn import new_run_id
from core.chat import ConversationKey, Inbound, Responder
from core.records import record


class DispatchHost(TakeoverHost, Protocol):
    """What the dispatcher needs of the agent."""

    lanes: dict[ConversationKey, Lane]
    prefs: ProviderPrefs
    approvals: ApprovalDesk


@record(slots=True)
class Queued:
    """Whoever awaits a queued run taken in here: where it answers, and (`done`) who
    receives its report."""

    inbound: Inbound
    responder: Responder
    run_id: str
    done: asyncio.Future[RunReport] | None = None

    def settle(self, report: RunReport) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(report)


class Intake:
    """The dispatcher's input side: what is taken in here waits in the store, and its
    waiter here (`_waiters`) until the run starts or ends."""

    host: DispatchHost
    _waiters: dict[str, Queued]
    _wake: asyncio.Event

    def shares(self, key: ConversationKey) -> bool:
        raise NotImplementedError

    def publish(self, topic: str, payload: str) -> None:
        raise NotImplementedError

    async def _create(self, queued: Queued, conv: str, shared: bool) -> bool:
        """Store `queued` as a queued run (its event marked seen in the same commit);
        False if the event was taken in already."""
        if queued.inbound.event_id:
            self.host.store.mark_seen_soon(queued.inbound.channel, queued.inbound.event_id)
        await self.host.store.create_run(
            queued.run_id, conv, "user", state="queued", text=queued.inbound.text, shared=shared
        )
        return True

    async def take_in(
        self, inbound: Inbound, responder: Responder, done: asyncio.Future[RunReport] | None
    ) -> bool:
        """Text: a queued run in the store (the platform event marked seen in the same
        commit), announced; a full queue turns it away. False if it was a duplicate."""
        store, conv, most = self.host.store, ":".join(inbound.key), self.host.max_queued
        runs = await store.runs(conv=conv, states=["queued", "running"], limit=most + 2)
        queued = sum(r.state == "queued" for r in runs)
        # with nothing running, the oldest queued run is being claimed: it does not wait
        waiting = queued if queued < len(runs) else max(queued - 1, 0)
        if waiting >= most:
            return await self._turn_away(inbound, responder, conv, waiting, done)
        waiter = Queued(inbound, responder, new_run_id(), done)
        if inbound.user_id:  # whoever claims it knows the sender (docs/governance.md#roles)
            store.add_sender(waiter.run_id, inbound.user_id, inbound.user_name, inbound.groups)
        with self._awaited(waiter):
            created = await self._create(waiter, conv, self.shares(inbound.key))
        if not created:
            self._waiters.pop(waiter.run_id, None)
            event = {"channel": inbound.channel, "id": inbound.event_id}
            self.host.events.emit("channel.event.duplicate", event)
            waiter.settle(RunReport("", "cancelled", "", stop_reason="duplicate"))
            return False
        self._announce(conv)
        return True

    async def enqueue(self, queued: Queued, trigger: str = "user") -> None:
        """`queued` as a queued run in the store, announced; whoever awaits it hears how
        the run ended, wherever it ran (a goal's turns queue so: `core.agent.goals`)."""
        conv = ":".join(queued.inbound.key)
        shared = self.shares(queued.inbound.key)
        with self._awaited(queued):
            await self.host.store.create_run(
                queued.run_id,
                conv,
                trigger,
                state="queued",
                text=queued.inbound.text,
                shared=shared,
            )
        self._announce(conv)

    @contextlib.contextmanager
    def _awaited(self, queued: Queued) -> Iterator[None]:
        """`queued` is waited for here before its row can be claimed: a claim pass already
        under way (woken by another run) may claim it the moment its commit lands. Let go
        again if storing it fails."""
        self._waiters[queued.run_id] = queued
        try:
            yield
        except BaseException:
            self._waiters.pop(queued.run_id, None)
            raise

    def announce(self, conv: str) -> None:
        """A queued run of `conv` was stored by someone else (a trigger's delivery): the
        claim loops of every worker hear of it."""
        self._announce(conv)

    def _announce(self, conv: str) -> None:
        self.publish("queued", conv)
        self._wake.set()

    async def withdraw(self, queued: Queued, reason: str) -> None:
        """`queued`'s run leaves the queue unless it was claimed already."""
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
        """A full queue: the message is not queued, and its sender is told so."""
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


__all__ = ["DispatchHost", "Intake", "Queued"]
