"""`core.lease.LeaseHolder` on the real stores (SQLite and PostgreSQL), its schedule driven
by a manual clock: one holder at a time runs the singleton, renewals keep it, a refused,
failed or unanswered renewal stops it at once (before the lease could pass to another
worker), and a clean shutdown releases it so a successor takes over at its next try.

The leases' expiry is the store's own clock; the tests use a long ttl (nothing expires on
its own) and move the holders' schedule with `ManualClock.advance`."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from core.lease import LeaseHolder
from core.store import Store, open_store
from tests.fakes.clock import ManualClock
from tests.store.conftest import postgres_schema

TTL = 30.0
LEASE = "telegram:poll:42"


async def until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"no {what} within {timeout:g} s") from None


class Where:
    """One backend's data: opens stores on it and can block writes to the leases table."""

    def __init__(self, backend: str, target: str | Path) -> None:
        self.backend, self.target = backend, target

    async def open(self) -> Store:
        return await open_store(self.target)

    @contextlib.asynccontextmanager
    async def leases_locked(self) -> AsyncIterator[None]:
        """Another session holds the lease rows: a renewal waits for it."""
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.target, isolation_level=None, timeout=10)
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield
                conn.execute("ROLLBACK")
            finally:
                conn.close()
            return
        import psycopg

        async with await psycopg.AsyncConnection.connect(str(self.target)) as pg:
            await pg.execute("SELECT name FROM leases FOR UPDATE")
            yield
            await pg.rollback()


@pytest.fixture(params=["postgres"])  # leases are a shared store's (`SharedStore`)
async def where(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Where]:
    if request.param == "sqlite":
        yield Where("sqlite", tmp_path / "parley.db")
        return
    async with postgres_schema() as url:
        yield Where("postgres", url)


class Singleton:
    """A singleton body that records when it runs and when it is stopped."""

    def __init__(self, fail_first: bool = False) -> None:
        self.running = 0
        self.started = 0
        self.stopped = 0
        self.fail_first = fail_first

    async def __call__(self) -> None:
        self.started += 1
        self.running += 1
        try:
            if self.fail_first and self.started == 1:
                raise RuntimeError("the poller crashed")
            await asyncio.Event().wait()
        finally:
            self.running -= 1
            self.stopped += 1


class Leases:
    """The real store's lease calls, counted while they are under way: a holder waiting
    on its clock may still be waiting for the store too (a renewal races its deadline)."""

    def __init__(self, store: Store) -> None:
        self.store, self.busy = store, 0

    async def _count(self, call: Awaitable[bool | None]) -> Any:
        self.busy += 1
        try:
            return await call
        finally:
            self.busy -= 1

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool:
        return bool(await self._count(self.store.take_lease(name, holder, ttl)))

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        return bool(await self._count(self.store.renew_lease(name, holder, ttl)))

    async def release_lease(self, name: str, holder: str) -> None:
        await self._count(self.store.release_lease(name, holder))


class Worker:
    """One holder on its own store connection, clock and body."""

    def __init__(self, store: Store, name: str, body: Singleton | None = None) -> None:
        self.store, self.body, self.clock = store, body or Singleton(), ManualClock()
        self.leases = Leases(store)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.holder = LeaseHolder(
            self.leases,
            LEASE,
            name,
            self.body,
            ttl=TTL,
            clock=self.clock,
            emit=lambda event, data: self.events.append((event, data)),
        )
        self.task = asyncio.create_task(self.holder.run())

    def said(self, event: str) -> list[str]:
        return [data["why"] for name, data in self.events if name == event]

    async def settled(self) -> None:
        """Until the holder waits on its clock alone (its next step needs `advance`)."""
        await until(
            lambda: self.clock.wake_times() and not self.leases.busy, "holder waiting on its clock"
        )

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def workers(where: Where, *names: str) -> AsyncIterator[list[Worker]]:
    stores = [await where.open() for _ in names]
    running = [Worker(store, name) for store, name in zip(stores, names, strict=True)]
    try:
        yield running
    finally:
        for worker in running:
            await worker.stop()
        for store in stores:
            with contextlib.suppress(Exception):
                await store.aclose()


async def test_one_worker_at_a_time_runs_the_singleton_and_renewals_keep_it(
    where: Where,
) -> None:
    async with workers(where, "a", "b") as both:
        for worker in both:
            await worker.settled()
        a, b = sorted(both, key=lambda w: -w.body.running)  # a: the one that took it
        assert (a.body.running, b.body.running) == (1, 0)
        assert a.said("lease.taken") == ["taken"]
        assert b.events == []
        for _ in range(6):  # two ttl's worth of renewals (store-side the lease is 30 s)
            a.clock.advance(TTL / 3)
            b.clock.advance(TTL / 3)  # b keeps trying, and is refused
            await a.settled()
            await b.settled()
        assert (a.body.running, b.body.running) == (1, 0)
        assert a.holder.tenures == 1
        assert b.holder.tenures == 0
        assert not await b.store.take_lease(LEASE, "c", TTL)


async def test_a_refused_renewal_stops_the_singleton_at_once(where: Where) -> None:
    async with workers(where, "a") as (a,):
        await a.settled()
        assert a.body.running == 1
        # The lease went to another worker (as if a's store session had stalled for long).
        await a.store.release_lease(LEASE, "a")
        assert await a.store.take_lease(LEASE, "b", TTL)
        a.clock.advance(TTL / 3)
        await until(lambda: a.body.stopped == 1, "the singleton stopped")
        assert a.said("lease.lost") == ["another worker holds it"]
        await a.settled()
        a.clock.advance(a.holder.retry)  # tries again later, and is refused
        await a.settled()
        assert a.body.running == 0
        assert a.holder.tenures == 1


async def test_an_unanswered_renewal_stops_the_singleton_before_the_lease_runs_out(
    where: Where,
) -> None:
    async with workers(where, "a") as (a,):
        await a.settled()
        async with where.leases_locked():
            a.clock.advance(TTL / 3)  # the renewal is sent and waits on the lock
            # it may wait until a third of the ttl before the lease's end: 2/3 ttl
            await until(lambda: a.clock.wake_times() == [2 * TTL / 3], "the renewal's deadline")
            assert a.body.running == 1
            a.clock.advance(TTL / 3)
            await until(lambda: a.body.stopped == 1, "the singleton stopped")
            assert a.said("lease.lost") == ["the store did not answer the renewal in time"]
            assert a.clock.now < TTL  # stopped while the lease is still surely its own


@pytest.mark.store_failures_expected
async def test_an_unreachable_store_stops_the_singleton(where: Where) -> None:
    async with workers(where, "a") as (a,):
        await a.settled()
        await a.store.aclose()
        a.clock.advance(TTL / 3)
        await until(lambda: a.body.stopped == 1, "the singleton stopped")
        (why,) = a.said("lease.lost")
        assert why.startswith("the renewal failed")
        await a.settled()
        a.clock.advance(a.holder.retry)  # taking fails too; the holder keeps trying
        await a.settled()
        assert not a.task.done()


async def test_a_clean_shutdown_releases_so_the_successor_takes_over_at_its_next_try(
    where: Where,
) -> None:
    async with workers(where, "a", "b") as both:
        for worker in both:
            await worker.settled()
        a, b = sorted(both, key=lambda w: -w.body.running)
        await a.stop()
        assert a.body.stopped == 1
        assert a.said("lease.released") == ["released"]
        b.clock.advance(b.holder.retry)  # long before the lease's 30 s would have run out
        await until(lambda: b.body.running == 1, "b running the singleton")
        assert b.said("lease.taken") == ["taken"]


async def test_a_singleton_that_fails_hands_the_lease_on_and_is_started_again(
    where: Where,
) -> None:
    store = await where.open()
    other = await where.open()
    body = Singleton(fail_first=True)
    worker = Worker(store, "a", body)
    try:
        await until(lambda: body.stopped == 1, "the first tenure ended")
        await worker.settled()
        assert worker.said("lease.released") == ["released"]
        assert await other.take_lease(LEASE, "b", TTL)  # free for anyone meanwhile
        await other.release_lease(LEASE, "b")
        worker.clock.advance(worker.holder.retry)
        await until(lambda: body.running == 1, "the second tenure")
        assert worker.holder.tenures == 2
    finally:
        await worker.stop()
        await store.aclose()
        await other.aclose()


def test_a_lease_needs_a_positive_ttl() -> None:
    async def body() -> None:
        return None

    store: Any = object()
    with pytest.raises(ValueError, match="ttl"):
        LeaseHolder(store, LEASE, "a", body, ttl=0)


class SlowStoreClock(ManualClock):
    """Every reading is half a ttl later than the one before: as if each store call took
    that long to answer."""

    def monotonic(self) -> float:
        self.now += TTL / 2
        return self.now


async def test_a_take_answered_too_late_is_handed_back_unused(where: Where) -> None:
    store = await where.open()
    body = Singleton()
    clock = SlowStoreClock()
    holder = LeaseHolder(store, LEASE, "a", body, ttl=TTL, clock=clock)
    task = asyncio.create_task(holder.run())
    try:
        await until(lambda: clock.wake_times(), "the holder waiting to try again")
        assert (body.started, holder.tenures) == (0, 0)
        assert await store.take_lease(LEASE, "b", TTL)  # released: free for another
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.aclose()
