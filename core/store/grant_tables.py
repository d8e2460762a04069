"""`GrantStore` written once for both backends (the rows and their SQL: `grant_rows.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.grant_rows import GrantRow, delete_grant, grant_row, insert_grant, select_grants


class GrantSql:
    """The statements of `GrantTables` in one dialect, spelt once at import (the
    selection is completed per call: the number of keys varies)."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        self.insert = insert_grant(d.param)
        self.delete = delete_grant(d.param)


SQLITE_GRANTS = GrantSql(SQLITE)
POSTGRES_GRANTS = GrantSql(POSTGRES)


class GrantTables:
    """`GrantStore` over a database whose statements `_grant_sql` spells (a backend's
    class puts its database first among its bases)."""

    _grant_sql: GrantSql

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def write(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def add_grant(self, row: GrantRow) -> None:
        params = (row.id, row.scope, row.key, row.tool, row.granted_by, row.granted_at)
        self.write_soon(self._grant_sql.insert, params)

    async def grants(self, keys: Sequence[str]) -> list[GrantRow]:
        if not keys:
            return []
        sql = select_grants(self._grant_sql.dialect.param, len(keys))
        return [grant_row(r) for r in await self._all(sql, keys)]

    async def revoke_grant(self, grant_id: str, keys: Sequence[str]) -> GrantRow | None:
        found = [g for g in await self.grants(keys) if g.id == grant_id]
        if not found:
            return None
        await self.write(self._grant_sql.delete, (grant_id,))
        return found[0]
