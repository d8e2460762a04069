"""`TriggerStore` written once for both backends (the rows and the seam: `trigger_rows.py`).

The dedupe is one `INSERT … ON CONFLICT DO NOTHING RETURNING`: the primary key decides
which of two racing workers stores the delivery, and the returned row says it was this
one — no read-then-write window for a redelivery to slip through. An accepted delivery's
runs are stored in the same transaction as its row (`accept_delivery`): both, or neither.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.errors import StoreError
from core.secrets import SECRETS
from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.run_tables import POSTGRES_RUNS, SQLITE_RUNS, RunSql
from core.store.trigger_rows import (
    DELIVERY_COLUMNS,
    Acceptance,
    PlatformThread,
    TriggerDelivery,
    trigger_delivery,
)

if TYPE_CHECKING:
    from core.store.postgres_db import Pool


class TriggerSql:
    """The statements of `TriggerTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect, runs: RunSql) -> None:
        marks = ", ".join(["?"] * len(DELIVERY_COLUMNS.split(",")))
        q = d.sql
        self.record = q(
            f"INSERT INTO trigger_deliveries ({DELIVERY_COLUMNS}) VALUES ({marks}) "
            "ON CONFLICT (trigger, delivery_id) DO NOTHING RETURNING 1"
        )
        self.purge = q("DELETE FROM trigger_deliveries WHERE received_at < ? RETURNING 1")
        self.purge_rate = q("DELETE FROM trigger_rate WHERE minute < ?")
        # Ties on `received_at` may give a trigger two rows: `last_deliveries` keeps one.
        self.last = (
            f"SELECT {DELIVERY_COLUMNS} FROM trigger_deliveries AS d WHERE received_at = "
            "(SELECT MAX(received_at) FROM trigger_deliveries AS e WHERE e.trigger = d.trigger) "
            "ORDER BY trigger, delivery_id"
        )
        self.recent = q(
            f"SELECT {DELIVERY_COLUMNS} FROM trigger_deliveries "
            "ORDER BY received_at DESC, delivery_id LIMIT ?"
        )
        self.open_key = q(
            "INSERT INTO trigger_threads (trigger, thread_key, conv, opened_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (trigger, thread_key) DO NOTHING"
        )
        self.key_conv = q("SELECT conv FROM trigger_threads WHERE trigger = ? AND thread_key = ?")
        self.close_key = q("DELETE FROM trigger_threads WHERE trigger = ? AND thread_key = ?")
        self.new_place = q("INSERT INTO platform_threads (conv, place, header) VALUES (?, ?, ?)")
        self.place = q("SELECT conv, place, header, thread FROM platform_threads WHERE conv = ?")
        self.set_thread = q(
            "UPDATE platform_threads SET thread = ?, alias = ? WHERE conv = ? RETURNING 1"
        )
        self.alias = q("SELECT conv FROM platform_threads WHERE alias = ?")
        self.count = q(
            "INSERT INTO trigger_rate (trigger, minute, count) VALUES (?, ?, 1) "
            "ON CONFLICT (trigger, minute) DO UPDATE SET count = trigger_rate.count + 1 "
            "RETURNING count"
        )
        self.create_run = runs.create_run


SQLITE_TRIGGERS = TriggerSql(SQLITE, SQLITE_RUNS)
POSTGRES_TRIGGERS = TriggerSql(POSTGRES, POSTGRES_RUNS)

Execute = Callable[[str, Sequence[Any]], list[Any]]


def _steps(sql: TriggerSql, accepted: Acceptance, now: float) -> Any:
    """The statements of `accept_delivery`, as a generator that yields each `(sql,
    params)` and is sent its rows: one plan for the sync (SQLite) and async (PostgreSQL)
    transactions. Its return value is the conversation, or None for a duplicate."""
    delivery = accepted.delivery
    if not (yield sql.record, delivery.params()):
        return None
    conv = accepted.new_conv
    if accepted.thread_key is not None:
        key = (delivery.trigger, accepted.thread_key)
        yield sql.open_key, (*key, conv, now)
        conv = str((yield sql.key_conv, key)[0][0])
    if conv == accepted.new_conv:
        yield sql.new_place, (conv, accepted.place, accepted.header)
    for run_id, kind, text in accepted.runs:
        # queued, of no worker: any worker claims it (docs/triggers.md)
        yield sql.create_run, (run_id, conv, "queued", kind, now, None, text, None, None)
    if accepted.closes and accepted.thread_key is not None:
        yield sql.close_key, (delivery.trigger, accepted.thread_key)
    return conv


class TriggerTables:
    """`TriggerStore` over a database whose statements `_trigger_sql` spells (a backend's
    class puts its database first among its bases)."""

    _trigger_sql: TriggerSql

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def _write_now(self, sql: str, params: Callable[[], Sequence[Any]]) -> list[Any]: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    async def record_delivery(self, delivery: TriggerDelivery) -> bool:
        rows = await self._write_now(self._trigger_sql.record, delivery.params)
        return bool(rows)

    async def purge_deliveries(self, before: float) -> int:
        await self._write_now(self._trigger_sql.purge_rate, lambda: (int(before // 60) - 1,))
        return len(await self._write_now(self._trigger_sql.purge, lambda: (before,)))

    async def last_deliveries(self) -> dict[str, TriggerDelivery]:
        found: dict[str, TriggerDelivery] = {}
        for row in await self._all(self._trigger_sql.last):
            delivery = trigger_delivery(row)
            found.setdefault(delivery.trigger, delivery)  # of a tie, the first id
        return found

    async def recent_deliveries(self, limit: int) -> list[TriggerDelivery]:
        return [trigger_delivery(r) for r in await self._all(self._trigger_sql.recent, (limit,))]

    async def count_delivery(self, trigger: str, minute: int) -> int:
        rows = await self._write_now(self._trigger_sql.count, lambda: (trigger, minute))
        return int(rows[0][0])

    async def platform_thread(self, conv: str) -> PlatformThread | None:
        row = await self._one(self._trigger_sql.place, (conv,))
        if row is None:
            return None
        thread = None if row[3] is None else str(row[3])
        return PlatformThread(str(row[0]), str(row[1]), str(row[2]), thread)

    async def set_platform_thread(self, conv: str, thread: str, alias: str) -> None:
        await self._write_now(self._trigger_sql.set_thread, lambda: (thread, alias, conv))

    async def conversation_alias(self, alias: str) -> str | None:
        row = await self._one(self._trigger_sql.alias, (alias,))
        return None if row is None else str(row[0])


class SqliteTriggerTables(TriggerTables):
    """SQLite: the acceptance is one transaction that holds the database's write lock."""

    if TYPE_CHECKING:

        async def _write_now_with(
            self, work: Callable[[sqlite3.Connection], list[Any]], what: str
        ) -> list[Any]: ...

    async def accept_delivery(self, accepted: Acceptance) -> str | None:
        sql = self._trigger_sql

        def work(conn: sqlite3.Connection) -> list[Any]:
            plan = _steps(sql, accepted, time.time())
            rows: list[Any] | None = None
            try:
                while True:
                    statement, params = plan.send(rows)
                    rows = conn.execute(statement, SECRETS.scrub_params(params)).fetchall()
            except StopIteration as done:
                return [done.value]

        found = await self._write_now_with(work, "a trigger delivery's acceptance")
        return found[0]  # type: ignore[no-any-return]


class PostgresTriggerTables(TriggerTables):
    """PostgreSQL: one transaction; two deliveries opening one key wait on its row."""

    if TYPE_CHECKING:
        _pool: Pool

        async def committed(self) -> None: ...

    async def accept_delivery(self, accepted: Acceptance) -> str | None:
        await self.committed()
        # Its own task: a caller cancelled meanwhile does not cut the transaction off.
        return await asyncio.shield(asyncio.ensure_future(self._accept(accepted)))

    async def _accept(self, accepted: Acceptance) -> str | None:
        import psycopg  # the `postgres` extra: only a PostgreSQL store gets here

        from core.store.postgres_db import text_safe

        sql = self._trigger_sql
        try:
            async with self._pool.connection() as conn, conn.transaction():
                plan = _steps(sql, accepted, time.time())
                rows: list[Any] | None = None
                try:
                    while True:
                        statement, params = plan.send(rows)
                        safe = text_safe(SECRETS.scrub_params(params))
                        cursor = await conn.execute(statement, safe)
                        rows = await cursor.fetchall() if cursor.description else []
                except StopIteration as done:
                    conv: str | None = done.value
                    return conv
        except psycopg.Error as exc:
            raise StoreError(f"a trigger delivery's acceptance failed: {exc}") from exc


__all__ = [
    "POSTGRES_TRIGGERS",
    "SQLITE_TRIGGERS",
    "PostgresTriggerTables",
    "SqliteTriggerTables",
    "TriggerTables",
]
