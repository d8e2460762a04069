"""`GrantStore` on SQLite (core/store/grant_rows.py)."""

from __future__ import annotations

from collections.abc import Sequence

from core.store.grant_rows import GrantRow, delete_grant, grant_row, insert_grant, select_grants
from core.store.sqlite_db import SqliteDatabase


class SqliteGrantTables(SqliteDatabase):
    """`GrantStore` on SQLite (`SqliteStore` adds the rest)."""

    def add_grant(self, row: GrantRow) -> None:
        params = (row.id, row.scope, row.key, row.tool, row.granted_by, row.granted_at)
        self.write_soon(insert_grant("?"), params)

    async def grants(self, keys: Sequence[str]) -> list[GrantRow]:
        if not keys:
            return []
        return [grant_row(r) for r in await self._all(select_grants("?", len(keys)), keys)]

    async def revoke_grant(self, grant_id: str, keys: Sequence[str]) -> GrantRow | None:
        found = [g for g in await self.grants(keys) if g.id == grant_id]
        if not found:
            return None
        await self.write(delete_grant("?"), (grant_id,))
        return found[0]
