"""One SQLite database (WAL) behind a reader and a writer connection (WAL lets one write
while the other reads); aiosqlite's connection only migrates the file at open.

Reads run on the event loop: in WAL mode a read never waits for a writer and an indexed one
takes µs, while a hop to aiosqlite's thread cost more than the read, and with 200
conversations reading at once the hand-offs kept model connections busy for longer (the
pool then opened one per conversation: three times the CPU per turn).

Writes are group-committed (`group_commit.py`): 200 busy conversations cost a handful of
commits, not thousands. A step's batch is committed on the event loop itself — in WAL mode
with `synchronous=NORMAL` a commit appends to the log without an fsync, tens of µs, while
a hop to a worker thread cost more than the work in GIL hand-offs and wake-ups (10 % of a
tool iteration's CPU, and most of it under 200 concurrent turns). What may wait or take
long goes to a worker thread: a batch that finds the write lock held (by another process),
a large batch, a statement that returns rows (`_write_now`), and the log's checkpoint into
the database file (with its fsync), which the writer connection never runs by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

import aiosqlite

from core.secrets import SECRETS
from core.store.group_commit import GroupCommit, Statement, failed_write, grouped

INLINE_STATEMENTS = 64  # a larger batch is committed in the worker thread
CHECKPOINT_STATEMENTS = 2000  # about SQLite's own 1,000 log pages for a step's small rows
BUSY_TIMEOUT_MS = 5000


class SqliteDatabase(GroupCommit):
    """The connections and the group commit that `SqliteStore`'s methods are written on."""

    def __init__(
        self, conn: aiosqlite.Connection, writer: sqlite3.Connection, reader: sqlite3.Connection
    ) -> None:
        # The connection that migrated the file at open. Kept open for the store's life:
        # closing it then may close the file's last connection, which checkpoints and
        # drops the WAL while another store opens it ('database is locked').
        self._conn = conn
        self._write_conn = writer
        self._read_conn = reader
        # The writer connection: one batch or statement at a time.
        self._connection_in_use = asyncio.Lock()
        self._since_checkpoint = 0  # statements committed since the log was checkpointed
        super().__init__()

    async def aclose(self) -> None:
        """Flush what is queued, then close both connections — also when the flush
        fails: aiosqlite's worker thread would otherwise keep the process alive."""
        try:
            await self._drain()
        finally:
            await self._conn.close()
            self._read_conn.close()
            async with self._connection_in_use:
                self._write_conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _commit(self, statements: list[Statement]) -> dict[int, Exception]:
        """Commit a batch (the writer loop never runs two at once): on the loop when the
        write lock is free and the batch small, else in the worker thread."""
        conn = self._write_conn
        async with self._connection_in_use:
            errors: dict[int, Exception] | None = None
            if len(statements) <= INLINE_STATEMENTS:
                with contextlib.suppress(_LockBusy):
                    errors = _commit_batch(conn, statements, wait=False)
            if errors is None:
                errors = await asyncio.to_thread(_commit_batch, conn, statements, wait=True)
            self._since_checkpoint += len(statements)
            if self._since_checkpoint >= CHECKPOINT_STATEMENTS:
                self._since_checkpoint = 0
                await asyncio.to_thread(_pragma, conn, "wal_checkpoint(PASSIVE)")
        return errors

    async def _write_now(self, sql: str, params: Callable[[], Sequence[Any]]) -> list[Any]:
        """Run one statement that returns rows (`RETURNING`) in a transaction of its own,
        after everything queued so far is committed; its rows. `params()` is called once
        the transaction holds the write lock (so a time in them is when it took effect).

        The transaction is one call in the worker thread: the lock is held for the
        statement alone (other processes waiting for it get their turn), and its rows are
        the statement's own, never a later read's older snapshot.

        Raises:
            StoreError: the statement failed.
        """
        return await self._write_now_with(
            # parameters scrubbed of secrets, as the queue's are
            lambda conn: conn.execute(sql, SECRETS.scrub_params(params())).fetchall(),
            sql,
        )

    async def _write_now_with(
        self, work: Callable[[sqlite3.Connection], list[Any]], what: str
    ) -> list[Any]:
        """`_write_now` for several statements: `work(connection)` runs them in one
        transaction that holds the write lock (in the worker thread); its result. `what`
        names the work in an error."""
        await self.committed()
        # A caller cancelled meanwhile must not free the writer connection while the
        # thread still uses it: the transaction ends in its own task.
        transaction = asyncio.ensure_future(self._transaction(work, what))
        transaction.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(transaction)

    async def _transaction(
        self, work: Callable[[sqlite3.Connection], list[Any]], what: str
    ) -> list[Any]:
        async with self._connection_in_use:
            try:
                return await asyncio.to_thread(_returning, self._write_conn, work)
            except sqlite3.Error as exc:
                raise failed_write(exc, what) from exc

    # --- reads ------------------------------------------------------------------------

    # On the loop (see the module doc). Each read is fetched to the end, so the connection
    # never keeps an older snapshot open across reads.

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._read_conn.execute(sql, params).fetchall()

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        rows = self._read_conn.execute(sql, params).fetchall()
        return rows[0] if rows else None


class _LockBusy(Exception):
    """The write lock is held elsewhere: the batch must wait for it, off the loop."""


def writer_connection(path: str) -> sqlite3.Connection:
    """The writer's own connection: it waits for the lock only when told to (in the
    worker thread) and never checkpoints by itself."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    _pragma(conn, "synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
    _pragma(conn, "busy_timeout=0")
    _pragma(conn, "wal_autocheckpoint=0")
    return conn


def reader_connection(path: str) -> sqlite3.Connection:
    """The connection reads run on, on the event loop (autocommit: a read is its own
    snapshot)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    _pragma(conn, f"busy_timeout={BUSY_TIMEOUT_MS}")  # only during a WAL recovery
    return conn


def _pragma(conn: sqlite3.Connection, pragma: str) -> None:
    """Run a PRAGMA and read its answer to the end: a cursor left with a row to read keeps
    its statement in progress, and the next COMMIT or SAVEPOINT on the connection fails."""
    conn.execute(f"PRAGMA {pragma}").fetchall()


@contextlib.contextmanager
def _waiting(conn: sqlite3.Connection, wait: bool) -> Iterator[None]:
    """While inside, `BEGIN IMMEDIATE` waits up to `BUSY_TIMEOUT_MS` for the lock (worker
    thread only: never on the loop)."""
    if not wait:
        yield
        return
    _pragma(conn, f"busy_timeout={BUSY_TIMEOUT_MS}")
    try:
        yield
    finally:
        _pragma(conn, "busy_timeout=0")


def _begin(conn: sqlite3.Connection, wait: bool) -> None:
    """Take the write lock (IMMEDIATE: before the first statement reads).

    Raises:
        _LockBusy: not `wait`, and another connection holds it.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if not wait and exc.sqlite_errorcode == sqlite3.SQLITE_BUSY:
            raise _LockBusy from exc
        raise


def _returning(
    conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], list[Any]]
) -> list[Any]:
    """`work` in a transaction of its own, waiting for the lock; what it returns."""
    with _waiting(conn, True):
        _begin(conn, wait=True)
        try:
            rows = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return rows


def _commit_batch(
    conn: sqlite3.Connection, statements: list[Statement], *, wait: bool
) -> dict[int, Exception]:
    """Run `statements` as one transaction. If one fails, the batch is run again
    statement by statement, each under a savepoint, so the bad one alone is left out.
    Returns the failed statements' errors by index.

    Raises:
        _LockBusy: not `wait`, and the write lock was held (no statement of the batch is
            left committed).
    """
    with _waiting(conn, wait):
        _begin(conn, wait)
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
        return _one_by_one(conn, statements, wait)


def _one_by_one(
    conn: sqlite3.Connection, statements: list[Statement], wait: bool
) -> dict[int, Exception]:
    """The batch again, each statement under a savepoint: the failing ones are left out."""
    errors: dict[int, Exception] = {}
    _begin(conn, wait)
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
