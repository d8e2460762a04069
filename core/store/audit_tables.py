"""The audit log's store methods (`AuditStore`) for both backends: reads written once,
the append per backend — each is one transaction that holds the chain's lock
(docs/governance.md#the-audit-log; the rows, hashes and SQL: `audit_rows.py`)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.errors import StoreError
from core.store.audit_rows import (
    HEAD,
    INSERT,
    MOVE_HEAD,
    SELECT_SINCE,
    AuditRow,
    audit_row,
    chain_hash,
)
from core.store.dialect import POSTGRES

if TYPE_CHECKING:
    from core.store.postgres_db import Pool

_PG_INSERT = POSTGRES.sql(INSERT)
_PG_MOVE_HEAD = POSTGRES.sql(MOVE_HEAD)
_PG_SELECT_SINCE = POSTGRES.sql(SELECT_SINCE)


def _next(
    head: Sequence[Any] | None, kind: str, actor: str, conv: str, detail: str
) -> tuple[AuditRow, tuple[Any, ...]]:
    """The row that follows `head` (its number and hash), and its insert's parameters."""
    if head is None:
        raise StoreError("the audit log has no head row; the schema is not migrated")
    seq, prev = int(head[0]) + 1, str(head[1])
    at = time.time()
    digest = chain_hash(prev, seq, at, kind, actor, conv, detail)
    row = AuditRow(seq, at, kind, actor, conv, json.loads(detail), prev, digest)
    return row, (seq, at, kind, actor, conv, detail, prev, digest)


class _AuditReads:
    """The reads, the same on both backends but for their placeholders."""

    _audit_select: str = SELECT_SINCE

    if TYPE_CHECKING:

        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    async def audit_rows(
        self, *, since: float = 0.0, after: int = 0, limit: int = 1000
    ) -> list[AuditRow]:
        rows = await self._all(self._audit_select, (since, after, limit))
        return [audit_row(r) for r in rows]

    async def audit_head(self) -> tuple[int, str] | None:
        row = await self._one(HEAD)
        return (int(row[0]), str(row[1])) if row is not None else None


class SqliteAuditTables(_AuditReads):
    """SQLite: the append runs in a transaction that holds the database's write lock."""

    if TYPE_CHECKING:

        async def _write_now_with(
            self, work: Callable[[sqlite3.Connection], list[Any]], what: str
        ) -> list[Any]: ...

    async def append_audit(self, kind: str, actor: str, conv: str, detail: str) -> AuditRow:
        def work(conn: sqlite3.Connection) -> list[Any]:
            row, params = _next(conn.execute(HEAD).fetchone(), kind, actor, conv, detail)
            conn.execute(INSERT, params)
            conn.execute(MOVE_HEAD, (row.seq, row.hash))
            return [row]

        rows = await self._write_now_with(work, "an audit log append")
        return rows[0]  # type: ignore[no-any-return]


class PostgresAuditTables(_AuditReads):
    """PostgreSQL: the append locks the head row (`FOR UPDATE`), so appends of several
    workers follow one another."""

    _audit_select = _PG_SELECT_SINCE

    if TYPE_CHECKING:
        _pool: Pool

    async def append_audit(self, kind: str, actor: str, conv: str, detail: str) -> AuditRow:
        # Its own task: a caller cancelled meanwhile does not cut the transaction off.
        return await asyncio.shield(asyncio.ensure_future(self._append(kind, actor, conv, detail)))

    async def _append(self, kind: str, actor: str, conv: str, detail: str) -> AuditRow:
        import psycopg  # the `postgres` extra: only a PostgreSQL store gets here

        try:
            async with self._pool.connection() as conn, conn.transaction():
                cursor = await conn.execute(f"{HEAD} FOR UPDATE")
                row, params = _next(await cursor.fetchone(), kind, actor, conv, detail)
                await conn.execute(_PG_INSERT, params)
                await conn.execute(_PG_MOVE_HEAD, (row.seq, row.hash))
                return row
        except psycopg.Error as exc:
            raise StoreError(f"an audit log append failed: {exc}") from exc


__all__ = ["PostgresAuditTables", "SqliteAuditTables"]
