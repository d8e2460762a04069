"""One PostgreSQL database behind a small connection pool (psycopg 3 and psycopg_pool):
reads take a connection each, writes are group-committed (`group_commit.py`).

The writer sends each batch as one transaction in one pipelined round trip. If a
statement fails, the batch is rolled back and run again statement by statement, each
under a savepoint, so the bad one alone is left out — as SQLite's writer does. A conflict
with another worker (deadlock, serialization failure) retries the whole batch first; a
lost connection loses the batch, and every statement's owner hears it.

Connections are autocommit (a read sees what is committed), and the pool checks one
before handing it out, so a restarted server costs nothing but reconnecting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Self

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import TransactionRollback
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from core.errors import ConfigError, StoreError
from core.secrets import SECRETS
from core.store.group_commit import GroupCommit, Statement, failed_write, grouped

Connection = AsyncConnection[TupleRow]
Pool = AsyncConnectionPool[Connection]

POOL_SIZE = 5  # per worker: the writer's batch and concurrent reads
_CONNECT_TIMEOUT = 10  # seconds, unless the URL says otherwise
_BATCH_ATTEMPTS = 3  # a batch another worker's transaction rolled back is tried again
_KEY = "store.url"


class PostgresDatabase(GroupCommit):
    """The pool and the group commit that `PostgresStore`'s methods are written on."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self.url = ""  # what `open` connected to, and how: a listener connects the same way
        self.connect_kwargs: dict[str, Any] = {}
        # `_write_now` statements that outlive their caller (see there), until they end
        self._transactions: set[asyncio.Future[list[TupleRow]]] = set()
        super().__init__()

    async def aclose(self) -> None:
        """Flush what is queued and let a statement whose caller gave up end (it would
        otherwise run later on a connection the closed pool had handed out), then close
        the pool (also when the flush fails)."""
        try:
            await self._drain()
        finally:
            if self._transactions:
                await asyncio.wait(set(self._transactions))
            await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _queue(self, statement: Statement, done: asyncio.Future[None] | None) -> None:
        super()._queue((statement[0], text_safe(statement[1])), done)

    async def _commit(self, statements: list[Statement]) -> dict[int, Exception]:
        async with self._pool.connection() as conn:
            for attempt in range(1, _BATCH_ATTEMPTS + 1):
                try:
                    await _run_batch(conn, statements)
                    return {}
                except TransactionRollback:
                    if attempt == _BATCH_ATTEMPTS:
                        break
                except psycopg.Error:
                    if conn.broken:
                        raise  # the batch is lost, not a statement's fault
                    break
            return await _run_one_by_one(conn, statements)

    async def _write_now(
        self, sql: str, params: Sequence[Any] | Callable[[], Sequence[Any]] = ()
    ) -> list[TupleRow]:
        """Run one statement that returns rows (`RETURNING`) in a transaction of its own,
        after everything queued so far is committed; its rows. `params` may be a function
        that gives them (as SQLite's `_write_now` takes them), called once before the
        statement is sent.

        Raises:
            StoreError: the statement failed.
        """
        await self.committed()
        # A caller cancelled meanwhile (a lease renewal given up on) must not cut the
        # statement off mid-transaction: it ends in its own task, and its locks with it.
        if callable(params):
            params = params()
        params = SECRETS.scrub_params(params)  # as the queue does
        transaction = asyncio.ensure_future(self._transaction(sql, params))
        self._transactions.add(transaction)
        transaction.add_done_callback(self._transaction_done)
        return await asyncio.shield(transaction)

    def _transaction_done(self, transaction: asyncio.Future[list[TupleRow]]) -> None:
        self._transactions.discard(transaction)
        if not transaction.cancelled():
            transaction.exception()  # retrieved: its caller may have gone

    async def _transaction(self, sql: str, params: Sequence[Any]) -> list[TupleRow]:
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, text_safe(params) or None)
                return await cursor.fetchall() if cursor.description else []
        except psycopg.Error as exc:
            raise failed_write(exc, sql) from exc

    # --- reads ------------------------------------------------------------------------

    async def location(self) -> str:
        """`database/schema`: where this store's tables are."""
        row = await self._one("SELECT current_database(), current_schema()")
        return f"{row[0]}/{row[1]}" if row else ""

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[TupleRow]:
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, text_safe(params) or None)
                return await cursor.fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"a read failed: {exc}") from exc

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> TupleRow | None:
        rows = await self._all(sql, params)
        return rows[0] if rows else None


async def _run_batch(conn: Connection, statements: list[Statement]) -> None:
    """All of `statements` in one transaction, pipelined: one round trip."""
    async with conn.pipeline(), conn.transaction(), conn.cursor() as cursor:
        for sql, group in grouped(statements):
            if len(group) == 1 or not group[0]:
                for params in group:  # no parameters: `%` is not a placeholder
                    await cursor.execute(sql, params or None)
            else:
                await cursor.executemany(sql, group)


async def _run_one_by_one(conn: Connection, statements: list[Statement]) -> dict[int, Exception]:
    """`statements` in one transaction, each under a savepoint; the failed ones by index."""
    errors: dict[int, Exception] = {}
    async with conn.transaction():
        for index, (sql, params) in enumerate(statements):
            try:
                async with conn.transaction():  # a savepoint, rolled back if it fails
                    await conn.execute(sql, params or None)
            except psycopg.Error as exc:
                if conn.broken:
                    raise
                errors[index] = exc
    return errors


def text_safe(params: Sequence[Any]) -> Sequence[Any]:
    """`params` with every NUL character of a string made U+FFFD: PostgreSQL's text cannot
    hold NUL, and a tool's output may (a binary file read as text)."""
    if not any(isinstance(p, str) and "\x00" in p for p in params):
        return params
    return [p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params]


def connection_kwargs(url: str, password: str | None) -> dict[str, Any]:
    """What every connection of the store is opened with, besides `url`.

    Raises:
        ConfigError: `url` is not a connection URL libpq accepts.
    """
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            _KEY,
            f"not a PostgreSQL URL: {exc}",
            "use postgresql://USER@HOST:PORT/DATABASE (libpq's URL form)",
        ) from exc
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = _CONNECT_TIMEOUT
    if "application_name" not in given:
        kwargs["application_name"] = "parley"  # who holds a connection, in pg_stat_activity
    if password:
        kwargs["password"] = password
    return kwargs


def where(url: str) -> str:
    """`url` as a person reads it in an error: host, port and database, no secrets."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(an unreadable URL)"
    host = parts.get("host") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"


async def open_pool(url: str, kwargs: dict[str, Any]) -> Pool:
    """The store's pool, open, with one connection made (so a wrong URL fails here)."""
    pool: Pool = AsyncConnectionPool(
        url,
        kwargs=kwargs,
        min_size=1,
        max_size=POOL_SIZE,
        open=False,
        check=AsyncConnectionPool.check_connection,
        name="parley-store",
    )
    await pool.open(wait=True, timeout=float(kwargs.get("connect_timeout", _CONNECT_TIMEOUT)))
    return pool
