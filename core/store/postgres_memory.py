"""`MemoryStore` on PostgreSQL: memories in a table whose `tsv` column PostgreSQL keeps
itself (generated from the text, English stemming), matched through a GIN index and
ranked by `ts_rank`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from core.store.memory_rows import (
    MEMORY_COLUMNS,
    MemoryRow,
    Scope,
    memory_row,
    query_terms,
    scope_filter,
)
from core.store.postgres_db import PostgresDatabase

# Normalisation 32 makes the rank r / (r + 1): 0..1, like SQLite's.
_RECALL = """
SELECT {columns}, ts_rank(tsv, query, 32) AS score
FROM memories, to_tsquery('english'::regconfig, %s) AS query
WHERE tsv @@ query AND {where}
ORDER BY score DESC, id DESC LIMIT %s
"""


class PostgresMemoryTables(PostgresDatabase):
    """`MemoryStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    async def remember(self, scope: Scope, text: str, *, made_by: str, conv: str) -> MemoryRow:
        rows = await self._write_now(
            "INSERT INTO memories (scope_kind, scope_id, text, created_at, made_by, conv) "
            f"VALUES (%s, %s, %s, %s, %s, %s) RETURNING {MEMORY_COLUMNS}",
            (scope.kind, scope.id, text, time.time(), made_by, conv),
        )
        return memory_row(rows[0])

    async def recall(self, query: str, scopes: Sequence[Scope], limit: int = 5) -> list[MemoryRow]:
        terms = query_terms(query)
        if not terms or not scopes or limit < 1:
            return []
        where, params = scope_filter(scopes, "%s")
        rows = await self._all(
            _RECALL.format(columns=MEMORY_COLUMNS, where=where),
            (" | ".join(terms), *params, limit),
        )
        return [memory_row(row, float(row[7])) for row in rows]

    async def memories(self, scopes: Sequence[Scope], limit: int = 50) -> list[MemoryRow]:
        where, params = scope_filter(scopes, "%s")
        rows = await self._all(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where} ORDER BY id DESC LIMIT %s",
            (*params, limit),
        )
        return [memory_row(row) for row in rows]

    async def forget_memory(self, memory_id: int, scopes: Sequence[Scope]) -> bool:
        where, params = scope_filter(scopes, "%s")
        rows = await self._write_now(
            f"DELETE FROM memories WHERE id = %s AND {where} RETURNING id",
            (memory_id, *params),
        )
        return bool(rows)

    async def forget_memories(self, scope: Scope) -> int:
        rows = await self._write_now(
            "DELETE FROM memories WHERE scope_kind = %s AND scope_id = %s RETURNING id",
            (scope.kind, scope.id),
        )
        return len(rows)
