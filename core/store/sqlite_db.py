"""One SQLite database (WAL) behind two connections: reads go through aiosqlite, writes
are group-committed.

Every caller's statements queue up and one writer runs all that are waiting as a single
transaction, in a single hop to a worker thread (a second connection; WAL lets it write
while the reader reads), so 200 busy conversations cost a handful of commits and thread
hops, not thousands. `write()` returns once its statement is committed (durable);
`write_soon()` queues without waiting (events, snapshots); `flush()` waits for everything
queued so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Sequence
from typing import Any, Self

import aiosqlite

from core.errors import StoreError
from core.store import writes

log = logging.getLogger(__name__)

Statement = tuple[str, Sequence[Any]]


LINGER = 0.005
"""Seconds a batch of un-awaited writes waits for more before it is committed."""


class SqliteDatabase:
    """The connections and the group commit that `SqliteStore`'s methods are written on."""

    def __init__(self, conn: aiosqlite.Connection, writer: sqlite3.Connection) -> None:
        self._conn = conn
        self._write_conn = writer
        self._inflight: asyncio.Future[None] | None = None
        self._pending: list[tuple[int, Statement, asyncio.Future[None] | None, str | None]] = []
        self._seq = 0  # statements queued so far
        # Failed write_soon statements: (seq, error, owner), until a flush reports them.
        self._failures: list[tuple[int, StoreError, str | None]] = []
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()  # someone awaits a commit: no lingering
        self._writer = asyncio.create_task(self._write_loop(), name="parley-store-writer")
        self.commits = 0

    async def aclose(self) -> None:
        """Flush what is queued, then close both connections — also when the flush
        fails: aiosqlite's worker thread would otherwise keep the process alive."""
        try:
            while self._pending or self._inflight is not None:  # also what flushing queued
                await self.flush()
        finally:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            await self._conn.close()
            self._write_conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the writer -----------------------------------------------------------------

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
        if self._pending:
            with contextlib.suppress(StoreError):  # the sentinel itself cannot fail
                await self.write("SELECT 1")  # the writer is sequential: this commits last
        elif self._inflight is not None:
            await asyncio.shield(self._inflight)
        failed = [f for f in self._failures if f[0] <= upto and f[2] == owner]
        if failed:
            self._failures = [f for f in self._failures if f not in failed]
            raise StoreError(f"{len(failed)} store write(s) failed; the first: {failed[0][1]}")

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
                errors = await self._commit([entry[1] for entry in batch])
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
                problem = StoreError(f"{error} (in: {sql.split('(')[0].strip()[:80]})")
                log.error("store: a write failed: %s", problem)
                writes.count_failed_write()
                if done is not None:
                    if not done.done():
                        done.set_exception(problem)
                else:
                    self._failures.append((seq, problem, owner))

    async def _commit(self, statements: list[Statement]) -> dict[int, Exception]:
        """Commit `statements`; returns the failed ones by index (the others are written).
        One thread hop per batch; the writer loop never runs two at once."""
        errors = await asyncio.to_thread(_commit_batch, self._write_conn, statements)
        self.commits += 1
        return errors

    # --- reads ------------------------------------------------------------------------

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        async with self._conn.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        async with self._conn.execute(sql, params) as cursor:
            return await cursor.fetchone()


def writer_connection(path: str) -> sqlite3.Connection:
    """The writer's own connection (used from the worker thread only)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _commit_batch(conn: sqlite3.Connection, statements: list[Statement]) -> dict[int, Exception]:
    """Run `statements` as one transaction (in the writer's thread). If one fails, the
    batch is run again statement by statement, each under a savepoint, so the bad one
    alone is left out. Returns the failed statements' errors by index."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, group in _grouped(statements):
            if len(group) == 1:
                conn.execute(sql, group[0])
            else:
                conn.executemany(sql, group)
        conn.execute("COMMIT")
        return {}
    except sqlite3.Error:
        conn.execute("ROLLBACK")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    errors: dict[int, Exception] = {}
    conn.execute("BEGIN IMMEDIATE")
    try:
        for index, (sql, params) in enumerate(statements):
            conn.execute("SAVEPOINT one")
            try:
                conn.execute(sql, params)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO one")
                errors[index] = exc
            conn.execute("RELEASE one")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return errors


def _grouped(statements: list[Statement]) -> list[tuple[str, list[Sequence[Any]]]]:
    """Consecutive runs of the same SQL become one `executemany`."""
    groups: list[tuple[str, list[Sequence[Any]]]] = []
    for sql, params in statements:
        if groups and groups[-1][0] == sql:
            groups[-1][1].append(params)
        else:
            groups.append((sql, [params]))
    return groups
