"""The group commit every backend writes through: statements queue up, and one writer
task commits all that are waiting as a single transaction.

`write()` returns once its statement is committed (durable); `write_soon()` queues without
waiting (events, snapshots); `flush()` waits for everything queued so far (`committed()`
too, raising nothing). A statement that fails loses only itself: the backend's `_commit`
leaves it out of the batch and reports it, `write()` raises it to its waiter, and a queued
one is raised by the next `flush()` of the task that owns it (`writes.write_for`), once.

Backends supply `_commit(statements)`: run them in order in one transaction and return the
failed ones by index (SQLite: one thread hop; PostgreSQL: one pipelined round trip).

Every text a statement writes is scrubbed of the configured secrets as it is queued
(`core.secrets`): whatever a run, an event or an error carries, no secret reaches the
database file.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from core import metrics
from core.errors import StoreError
from core.secrets import SECRETS
from core.store import writes

log = logging.getLogger(__name__)

Statement = tuple[str, Sequence[Any]]
LINGER = 0.005
"""Seconds a batch of un-awaited writes waits for more before it is committed."""


class GroupCommit(abc.ABC):
    """The queue, its owners, the failures not yet reported and the writer task."""

    def __init__(self) -> None:
        self._inflight: asyncio.Future[None] | None = None
        self._pending: list[tuple[int, Statement, asyncio.Future[None] | None, str | None]] = []
        self._seq = 0  # statements queued so far
        # Failed write_soon statements: (seq, error, owner), until a flush reports them.
        self._failures: list[tuple[int, StoreError, str | None]] = []
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()  # someone awaits a commit: no lingering
        self._writer = asyncio.create_task(self._write_loop(), name="parley-store-writer")
        self.commits = 0

    @abc.abstractmethod
    async def _commit(self, statements: list[Statement]) -> dict[int, Exception]:
        """Commit `statements` in order in one transaction, leaving out any that fail;
        return those by index. Raise if the whole batch is lost (not a statement's fault:
        every statement's owner hears it)."""

    async def _drain(self) -> None:
        """Flush until nothing is queued or in flight, then stop the writer task (also
        when a flush fails)."""
        try:
            while self._pending or self._inflight is not None:  # also what flushing queued
                await self.flush()
        finally:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer

    async def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement and return when it is committed.

        Raises:
            StoreError: this statement failed (the rest of its batch was committed).
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue((sql, params), done)
        await done

    def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Queue one statement for the next group commit without waiting for it; a failure
        is raised by the next `flush`."""
        self._queue((sql, params), None)

    def _queue(self, statement: Statement, done: asyncio.Future[None] | None) -> None:
        statement = (statement[0], SECRETS.scrub_params(statement[1]))
        self._seq += 1
        self._pending.append((self._seq, statement, done, writes.write_owner()))
        self._wake.set()
        if done is not None:
            self._urgent.set()

    @staticmethod
    def write_for(owner: str) -> None:
        """Tag the current task's writes as `owner`'s (a conversation), so that a failed
        one is raised by that owner's `flush`, not by another conversation's."""
        writes.write_for(owner)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (also a batch in flight).

        Raises:
            StoreError: a statement this task's owner (see `write_for`) queued before this
                call failed, and no `flush` has reported it yet.
        """
        upto, owner = self._seq, writes.write_owner()
        await self.committed()
        failed = [f for f in self._failures if f[0] <= upto and f[2] == owner]
        if failed:
            self._failures = [f for f in self._failures if f not in failed]
            raise StoreError(f"{len(failed)} store write(s) failed; the first: {failed[0][1]}")

    async def committed(self) -> None:
        """Wait until everything queued so far is committed, reporting no failure: those
        are their owners' `flush`'s to raise (for a statement run outside the group
        commit that must come after them, or a post the queued writes must precede)."""
        if self._pending:
            with contextlib.suppress(StoreError):  # the sentinel itself cannot fail
                await self.write("SELECT 1")  # the writer is sequential: this commits last
        elif self._inflight is not None:
            await asyncio.shield(self._inflight)

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            if not self._urgent.is_set():
                # Only queued writes, promised durable at the next flush: let the rest of
                # this step's writes join them (one commit per step, not one per write).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LINGER):
                        await self._urgent.wait()
            self._wake.clear()
            self._urgent.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            self._inflight = asyncio.get_running_loop().create_future()
            try:
                began = time.perf_counter()
                errors = await self._commit([entry[1] for entry in batch])
                metrics.store_commit(time.perf_counter() - began)
                self.commits += 1
            except Exception as exc:  # not a statement's fault (e.g. the disk): all hear it
                errors = dict.fromkeys(range(len(batch)), exc)
            finally:
                self._inflight.set_result(None)
                self._inflight = None
            for index, (seq, (sql, _), done, owner) in enumerate(batch):
                error = errors.get(index)
                if error is None:
                    if done is not None and not done.done():
                        done.set_result(None)
                    continue
                problem = failed_write(error, sql)
                if done is not None:
                    if not done.done():
                        done.set_exception(problem)
                else:
                    self._failures.append((seq, problem, owner))


def failed_write(error: Exception, sql: str) -> StoreError:
    """A write that failed, logged and counted, as its writer hears it."""
    problem = StoreError(f"{error} (in: {sql.split('(')[0].strip()[:80]})")
    log.error("store: a write failed: %s", problem)
    writes.count_failed_write()
    return problem


def grouped(statements: list[Statement]) -> list[tuple[str, list[Sequence[Any]]]]:
    """Consecutive runs of the same SQL become one `executemany`."""
    groups: list[tuple[str, list[Sequence[Any]]]] = []
    for sql, params in statements:
        if groups and groups[-1][0] == sql:
            groups[-1][1].append(params)
        else:
            groups.append((sql, [params]))
    return groups
