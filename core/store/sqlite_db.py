"""One SQLite database (WAL) behind two connections: reads go through aiosqlite, writes
are group-committed (`group_commit.py`).

The writer runs each batch in a single hop to a worker thread (a second connection; WAL
lets it write while the reader reads), so 200 busy conversations cost a handful of commits
and thread hops, not thousands.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Self

import aiosqlite

from core.store.group_commit import GroupCommit, Statement, failed_write, grouped


class SqliteDatabase(GroupCommit):
    """The connections and the group commit that `SqliteStore`'s methods are written on."""

    def __init__(self, conn: aiosqlite.Connection, writer: sqlite3.Connection) -> None:
        self._conn = conn
        self._write_conn = writer
        self._own_transaction = asyncio.Lock()  # one `_write_now` at a time on `_conn`
        self._since_checkpoint = 0  # statements committed since the log was checkpointed
        super().__init__()

    async def aclose(self) -> None:
        """Flush what is queued, then close both connections — also when the flush
        fails: aiosqlite's worker thread would otherwise keep the process alive."""
        try:
            await self._drain()
        finally:
            await self._conn.close()
            self._write_conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _commit(self, statements: list[Statement]) -> dict[int, Exception]:
        """Commit a batch (the writer loop never runs two at once).

        A step's batch (a few rows) is committed on the event loop: in WAL mode with
        `synchronous=NORMAL` a commit is a write to the log and no fsync, tens of µs,
        while a hop to a worker thread cost more than the work, in GIL hand-offs and
        wake-ups (10 % of a tool iteration's CPU). The thread still takes what may wait
        or take long: a batch that finds the write lock held (by another process, or
        `_write_now`), a large batch, and the log's checkpoint into the database (with
        its fsync), which the writer connection never runs on its own."""
        conn = self._write_conn
        if len(statements) <= INLINE_STATEMENTS:
            try:
                errors = _commit_batch(conn, statements)
            except _LockBusy:
                errors = await asyncio.to_thread(_commit_waiting, conn, statements)
        else:
            errors = await asyncio.to_thread(_commit_waiting, conn, statements)
        self._since_checkpoint += len(statements)
        if self._since_checkpoint >= CHECKPOINT_STATEMENTS:
            self._since_checkpoint = 0
            await asyncio.to_thread(_pragma, conn, "wal_checkpoint(PASSIVE)")
        return errors

    async def _write_now(
        self, sql: str, params: Callable[[], Sequence[Any]]
    ) -> list[aiosqlite.Row]:
        """Run one statement that returns rows (`RETURNING`) in a transaction of its own,
        after everything queued so far is committed; its rows. `params()` is called once
        the transaction holds the write lock (so a time in them is when it took effect).

        Raises:
            StoreError: the statement failed.
        """
        await self._after_queued()
        # A caller cancelled mid-transaction must not leave the shared reader connection
        # inside it (holding the write lock): the transaction ends in its own task.
        transaction = asyncio.ensure_future(self._transaction(sql, params))
        transaction.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(transaction)

    async def _transaction(
        self, sql: str, params: Callable[[], Sequence[Any]]
    ) -> list[aiosqlite.Row]:
        async with self._own_transaction:
            try:
                # IMMEDIATE: the write lock (waiting busy_timeout) before the statement reads
                await self._conn.execute("BEGIN IMMEDIATE")
                try:
                    async with self._conn.execute(sql, params()) as cursor:
                        rows = list(await cursor.fetchall())
                    await self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        await self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise failed_write(exc, sql) from exc
        return rows

    # --- reads ------------------------------------------------------------------------

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        async with self._conn.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        async with self._conn.execute(sql, params) as cursor:
            return await cursor.fetchone()


INLINE_STATEMENTS = 64  # a larger batch is committed in the worker thread
CHECKPOINT_STATEMENTS = 2000  # about SQLite's own 1,000 log pages for a step's small rows
BUSY_TIMEOUT_MS = 5000


class _LockBusy(Exception):
    """The write lock is held elsewhere: the batch must wait for it, off the loop."""


def writer_connection(path: str) -> sqlite3.Connection:
    """The writer's own connection: it never waits for the lock (`_commit` hands a batch
    that would to the worker thread) and never checkpoints by itself."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    _pragma(conn, "synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
    _pragma(conn, "busy_timeout=0")
    _pragma(conn, "wal_autocheckpoint=0")
    return conn


def _pragma(conn: sqlite3.Connection, pragma: str) -> None:
    """Run a PRAGMA and read its answer to the end: a cursor left with a row to read keeps
    its statement in progress, and the next COMMIT or SAVEPOINT on the connection fails."""
    conn.execute(f"PRAGMA {pragma}").fetchall()


def _commit_waiting(conn: sqlite3.Connection, statements: list[Statement]) -> dict[int, Exception]:
    """`_commit_batch` in the worker thread, waiting up to `BUSY_TIMEOUT_MS` for the lock."""
    _pragma(conn, f"busy_timeout={BUSY_TIMEOUT_MS}")
    try:
        return _commit_batch(conn, statements)
    finally:
        _pragma(conn, "busy_timeout=0")


def _begin(conn: sqlite3.Connection) -> None:
    """Take the write lock (IMMEDIATE: before the first statement reads)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode == sqlite3.SQLITE_BUSY:
            raise _LockBusy from exc
        raise


def _commit_batch(conn: sqlite3.Connection, statements: list[Statement]) -> dict[int, Exception]:
    """Run `statements` as one transaction. If one fails, the batch is run again
    statement by statement, each under a savepoint, so the bad one alone is left out.
    Returns the failed statements' errors by index.

    Raises:
        _LockBusy: the write lock was held and the connection does not wait for it (no
            statement of the batch is left committed).
    """
    _begin(conn)
    try:
        for sql, group in grouped(statements):
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
    _begin(conn)
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
