"""Leased singletons (docs/scale-out.md): work that must run in one worker at a time — a Telegram
long poll, a Discord gateway shard, the job scheduler — held through a named lease in the
shared store, and taken over by another worker within seconds when its holder dies.

A `LeaseHolder` tries to take its lease every `retry` seconds; while it holds it, it renews
it every `ttl / 3` seconds and runs the singleton. The lease's expiry is the store
server's clock, so a worker never trusts its own clock to know the lease is still its:
it counts its own time from the moment it *sent* the last successful take or renewal
(which the server read later), and stops the singleton as soon as a renewal is refused,
fails, or has not answered `ttl / 3` before that expiry — before any other worker could
take the lease. On a clean shutdown the lease is released, so a successor takes over at
its next try instead of waiting for the expiry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from core.clock import Clock, SystemClock
from core.events import EventName
from core.records import record

log = logging.getLogger(__name__)

RELEASE_TIMEOUT = 2.0  # seconds a clean shutdown waits to hand its lease back


class LeaseStore(Protocol):
    """The lease methods of `core.store.Store` (`WorkerStore`)."""

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool: ...

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool: ...

    async def release_lease(self, name: str, holder: str) -> None: ...


Emit = Callable[[EventName, dict[str, Any]], None]


@record(frozen=True, slots=True)
class Singleton:
    """Work only one worker may do at a time: `run` goes on until it is cancelled, and
    is run by whichever worker holds the lease `name`."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]


class LeaseHolder:
    """Runs `body` while this worker holds the lease `name`; see the module docstring.

    Args:
        store: where the lease lives (shared by every worker).
        name: the lease, e.g. `telegram:poll:123456` or `scheduler`.
        holder: this worker's id (unique per process).
        body: the singleton: runs until it is cancelled (a return or an exception ends
            this tenure: the lease is released and taken again at the next try).
        ttl: seconds a take or renewal holds the lease.
        retry: seconds between tries to take it while another worker holds it
            (default `ttl / 3`).
        clock: the holder's schedule (tests inject one).
        emit: reports `lease.taken`, `lease.lost` and `lease.released`.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        holder: str,
        body: Callable[[], Awaitable[None]],
        *,
        ttl: float,
        retry: float | None = None,
        clock: Clock | None = None,
        emit: Emit | None = None,
    ) -> None:
        if ttl <= 0:
            raise ValueError("a lease's ttl must be positive")
        self.store, self.name, self.holder, self.body = store, name, holder, body
        self.ttl = ttl
        self.retry = ttl / 3 if retry is None else retry
        self.clock: Clock = clock or SystemClock()
        self._emit = emit
        self.held = asyncio.Event()  # set while the singleton runs here
        self.tenures = 0  # how many times this worker took the lease

    async def run(self) -> None:
        """Until cancelled: take the lease when it is free and hold it while possible.
        Cancelling it (a clean shutdown) stops the singleton and releases the lease."""
        while True:
            sent = self.clock.monotonic()
            try:
                taken = await self._call(self.store.take_lease(self.name, self.holder, self.ttl))
            except asyncio.CancelledError:  # the take may have landed: hand it back
                await self._release(quietly=True)
                raise
            if taken:
                if self.clock.monotonic() - sent < self.ttl / 3:
                    await self._hold(sent + self.ttl)
                else:  # answered too late to be sure of it until the first renewal
                    await self._release(quietly=True)
            await self.clock.sleep(self.retry)

    async def _hold(self, valid_until: float) -> None:
        """Run the singleton until the lease is lost or the singleton ends (then the lease
        is released); a cancellation (shutdown) stops it and releases the lease."""
        self.tenures += 1
        self._report("lease.taken", "taken")
        body = asyncio.create_task(self._run_body(), name=f"lease {self.name}")
        self.held.set()
        try:
            lost = await self._keep(body, valid_until)
        except asyncio.CancelledError:
            await _stopped(body)
            self.held.clear()
            await self._release()
            raise
        await _stopped(body)  # at once: before the lease can expire and be taken
        self.held.clear()
        if lost is None:
            await self._release()
        else:
            self._report("lease.lost", lost)

    async def _keep(self, body: asyncio.Task[None], valid_until: float) -> str | None:
        """Renew every ttl/3 while `body` runs: None once it ended, else why the lease
        is lost. `valid_until` counts from when the take was sent (the server read it
        later, so the lease lasts at least that long)."""
        while True:
            wake = asyncio.create_task(self.clock.sleep(self.ttl / 3))
            try:
                await asyncio.wait({body, wake}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
            if body.done():
                return None
            sent = self.clock.monotonic()
            lost = await self._renew(deadline=valid_until - self.ttl / 3)
            if lost is not None:
                return lost
            valid_until = sent + self.ttl

    async def _run_body(self) -> None:
        try:
            await self.body()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("lease %s: the singleton failed; handing the lease on", self.name)
        else:
            log.warning("lease %s: the singleton ended; handing the lease on", self.name)

    async def _renew(self, *, deadline: float) -> str | None:
        """Renew the lease; None if renewed, else why it is lost (refused, failed, or no
        answer by `deadline`)."""
        renewal = asyncio.create_task(self.store.renew_lease(self.name, self.holder, self.ttl))
        timer = asyncio.create_task(self.clock.sleep(max(0.0, deadline - self.clock.monotonic())))
        try:
            await asyncio.wait({renewal, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            renewal.cancel()  # shutting down: the lease is released next
            raise
        finally:
            timer.cancel()
        if not renewal.done():
            renewal.cancel()
            return "the store did not answer the renewal in time"
        if renewal.cancelled():
            return "the renewal was cancelled"
        if (exc := renewal.exception()) is not None:
            return f"the renewal failed: {type(exc).__name__}: {exc}"
        return None if renewal.result() else "another worker holds it"

    async def _release(self, *, quietly: bool = False) -> None:
        """Hand the lease back; `quietly`: it was never used, so nothing is reported."""
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                await self.store.release_lease(self.name, self.holder)
        except (Exception, TimeoutError) as exc:  # the expiry frees it anyway
            log.warning("lease %s: could not release it: %s", self.name, exc)
            return
        if not quietly:
            self._report("lease.released", "released")

    async def _call(self, call: Awaitable[bool]) -> bool:
        """A take; a store that fails counts as "not taken" (tried again later)."""
        try:
            return await call
        except Exception as exc:
            log.warning("lease %s: could not reach the store: %s", self.name, exc)
            return False

    def _report(self, event: EventName, why: str) -> None:
        level = logging.WARNING if event == "lease.lost" else logging.INFO
        log.log(level, "lease %s %s by %s", self.name, why, self.holder)
        if self._emit is not None:
            self._emit(event, {"lease": self.name, "holder": self.holder, "why": why})


async def _stopped(task: asyncio.Task[None]) -> None:
    """Cancel `task` (if still running) and wait until it has ended."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
