"""`MemoryStore` on SQLite: memories in a table, found through an FTS5 index of their text
(porter stemming, ranked by BM25) that triggers keep in step with the table."""

from __future__ import annotations

from collections.abc import Sequence

from core.store.memory_rows import (
    MemoryRow,
    Scope,
    memory_columns,
    memory_row,
    scope_filter,
)
from core.store.memory_tables import SQLITE_MEMORY, MemoryTables
from core.store.sqlite_db import SqliteDatabase


class SqliteMemoryTables(SqliteDatabase, MemoryTables):
    """`MemoryStore` on SQLite (`SqliteStore` adds the rest)."""

    _memory_sql = SQLITE_MEMORY

    async def _recall(
        self, terms: Sequence[str], scopes: Sequence[Scope], limit: int
    ) -> list[MemoryRow]:
        where, params = scope_filter(scopes, "?", "m")
        rows = await self._all(
            f"SELECT {memory_columns('m')}, bm25(memories_fts) AS rank "
            "FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid "
            f"WHERE memories_fts MATCH ? AND {where} ORDER BY rank, m.id DESC LIMIT ?",
            (" OR ".join(f'"{term}"' for term in terms), *params, limit),
        )
        # BM25 is negative here, better the lower; r / (1 + r) puts it on 0..1.
        return [memory_row(row, -row[7] / (1 - row[7])) for row in rows]
