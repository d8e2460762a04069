"""`MemoryStore` on SQLite: memories in a table, found through an FTS5 index of their text
(porter stemming, ranked by BM25) that triggers keep in step with the table."""

from __future__ import annotations

import time
from collections.abc import Sequence

from core.store.memory_rows import (
    MEMORY_COLUMNS,
    MemoryRow,
    Scope,
    memory_columns,
    memory_row,
    query_terms,
    scope_filter,
)
from core.store.sqlite_db import SqliteDatabase


class SqliteMemoryTables(SqliteDatabase):
    """`MemoryStore` on SQLite (`SqliteStore` adds the rest)."""

    async def remember(self, scope: Scope, text: str, *, made_by: str, conv: str) -> MemoryRow:
        rows = await self._write_now(
            "INSERT INTO memories (scope_kind, scope_id, text, created_at, made_by, conv) "
            f"VALUES (?, ?, ?, ?, ?, ?) RETURNING {MEMORY_COLUMNS}",
            lambda: (scope.kind, scope.id, text, time.time(), made_by, conv),
        )
        return memory_row(rows[0])

    async def recall(self, query: str, scopes: Sequence[Scope], limit: int = 5) -> list[MemoryRow]:
        terms = query_terms(query)
        if not terms or not scopes or limit < 1:
            return []
        where, params = scope_filter(scopes, "?", "m")
        rows = await self._all(
            f"SELECT {memory_columns('m')}, bm25(memories_fts) AS rank "
            "FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid "
            f"WHERE memories_fts MATCH ? AND {where} ORDER BY rank, m.id DESC LIMIT ?",
            (" OR ".join(f'"{term}"' for term in terms), *params, limit),
        )
        # BM25 is negative here, better the lower; r / (1 + r) puts it on 0..1.
        return [memory_row(row, -row[7] / (1 - row[7])) for row in rows]

    async def memories(self, scopes: Sequence[Scope], limit: int = 50) -> list[MemoryRow]:
        where, params = scope_filter(scopes, "?")
        rows = await self._all(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [memory_row(row) for row in rows]

    async def forget_memory(self, memory_id: int, scopes: Sequence[Scope]) -> bool:
        where, params = scope_filter(scopes, "?")
        rows = await self._write_now(
            f"DELETE FROM memories WHERE id = ? AND {where} RETURNING id",
            lambda: (memory_id, *params),
        )
        return bool(rows)

    async def forget_memories(self, scope: Scope) -> int:
        rows = await self._write_now(
            "DELETE FROM memories WHERE scope_kind = ? AND scope_id = ? RETURNING id",
            lambda: (scope.kind, scope.id),
        )
        return len(rows)
