"""`MemoryStore` written once for both backends, but for `recall`'s search: full-text
search is each backend's own (`sqlite_memory.py`: FTS5 and BM25; `postgres_memory.py`: a
tsvector and `ts_rank`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.memory_rows import (
    MEMORY_COLUMNS,
    MemoryRow,
    Scope,
    memory_row,
    query_terms,
    scope_filter,
)


class MemorySql:
    """The statements of `MemoryTables` in one dialect, spelt once at import (those that
    filter by scope are completed per call: the number of scopes varies)."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        self.remember = d.sql(
            "INSERT INTO memories (scope_kind, scope_id, text, created_at, made_by, conv) "
            f"VALUES (?, ?, ?, ?, ?, ?) RETURNING {MEMORY_COLUMNS}"
        )
        self.forget_memories = d.sql(
            "DELETE FROM memories WHERE scope_kind = ? AND scope_id = ? RETURNING id"
        )


SQLITE_MEMORY = MemorySql(SQLITE)
POSTGRES_MEMORY = MemorySql(POSTGRES)


class MemoryTables:
    """`MemoryStore` over a database whose statements `_memory_sql` spells (a backend's
    class puts its database first among its bases, and adds `_recall`)."""

    _memory_sql: MemorySql

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def _write_now(self, sql: str, params: Callable[[], Sequence[Any]]) -> list[Any]: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    async def _recall(
        self, terms: Sequence[str], scopes: Sequence[Scope], limit: int
    ) -> list[MemoryRow]:
        """The memories in `scopes` that match any of `terms` (not empty), best first, at
        most `limit` (at least 1): the backend's own full-text search."""
        raise NotImplementedError

    async def recall(self, query: str, scopes: Sequence[Scope], limit: int = 5) -> list[MemoryRow]:
        terms = query_terms(query)
        if not terms or not scopes or limit < 1:
            return []
        return await self._recall(terms, scopes, limit)

    async def remember(self, scope: Scope, text: str, *, made_by: str, conv: str) -> MemoryRow:
        rows = await self._write_now(
            self._memory_sql.remember,
            lambda: (scope.kind, scope.id, text, time.time(), made_by, conv),
        )
        return memory_row(rows[0])

    async def memories(self, scopes: Sequence[Scope], limit: int = 50) -> list[MemoryRow]:
        p = self._memory_sql.dialect.param
        where, params = scope_filter(scopes, p)
        rows = await self._all(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where} ORDER BY id DESC LIMIT {p}",
            (*params, limit),
        )
        return [memory_row(row) for row in rows]

    async def forget_memory(self, memory_id: int, scopes: Sequence[Scope]) -> bool:
        p = self._memory_sql.dialect.param
        where, params = scope_filter(scopes, p)
        rows = await self._write_now(
            f"DELETE FROM memories WHERE id = {p} AND {where} RETURNING id",
            lambda: (memory_id, *params),
        )
        return bool(rows)

    async def forget_memories(self, scope: Scope) -> int:
        rows = await self._write_now(
            self._memory_sql.forget_memories, lambda: (scope.kind, scope.id)
        )
        return len(rows)
