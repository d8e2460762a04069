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
        """One thread hop per batch; the writer loop never runs two at once."""
        return await asyncio.to_thread(_commit_batch, self._write_conn, statements)

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
