"""`MemoryStore` on PostgreSQL: memories in a table whose `tsv` column PostgreSQL keeps
itself (generated from the text, English stemming), matched through a GIN index and
ranked by `ts_rank`."""

from __future__ import annotations

from collections.abc import Sequence

from core.store.memory_rows import (
    MEMORY_COLUMNS,
    MemoryRow,
    Scope,
    memory_row,
    scope_filter,
)
from core.store.memory_tables import POSTGRES_MEMORY, MemoryTables
from core.store.postgres_db import PostgresDatabase

# Normalisation 32 makes the rank r / (r + 1): 0..1, like SQLite's.
_RECALL = """
SELECT {columns}, ts_rank(tsv, query, 32) AS score
FROM memories, to_tsquery('english'::regconfig, %s) AS query
WHERE tsv @@ query AND {where}
ORDER BY score DESC, id DESC LIMIT %s
"""


class PostgresMemoryTables(PostgresDatabase, MemoryTables):
    """`MemoryStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    _memory_sql = POSTGRES_MEMORY

    async def _recall(
        self, terms: Sequence[str], scopes: Sequence[Scope], limit: int
    ) -> list[MemoryRow]:
        where, params = scope_filter(scopes, "%s")
        rows = await self._all(
            _RECALL.format(columns=MEMORY_COLUMNS, where=where),
            (" | ".join(terms), *params, limit),
        )
        return [memory_row(row, float(row[7])) for row in rows]
