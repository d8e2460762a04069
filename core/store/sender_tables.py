"""Who sent a run's message, for the worker that claims it (docs/governance.md#roles):
with several workers, a message taken in by one may run on another, which decides the
run's role from this row. Written once for both backends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect


class SenderSql:
    def __init__(self, d: Dialect) -> None:
        self.insert = d.sql(
            "INSERT INTO run_senders (run_id, user_id, user_name, groups) VALUES (?, ?, ?, ?)"
        )
        self.select = d.sql("SELECT user_id, user_name, groups FROM run_senders WHERE run_id = ?")


SQLITE_SENDERS = SenderSql(SQLITE)
POSTGRES_SENDERS = SenderSql(POSTGRES)


class SenderTables:
    """`RunSenderStore` over a database whose statements `_sender_sql` spells."""

    _sender_sql: SenderSql

    if TYPE_CHECKING:

        def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def add_sender(self, run_id: str, user_id: str, user_name: str, groups: Sequence[str]) -> None:
        params = (run_id, user_id, user_name, json.dumps(list(groups)))
        self.write_soon(self._sender_sql.insert, params)

    async def sender(self, run_id: str) -> tuple[str, str, tuple[str, ...]] | None:
        row = await self._one(self._sender_sql.select, (run_id,))
        if row is None:
            return None
        return str(row[0]), str(row[1]), tuple(json.loads(row[2]))


__all__ = ["POSTGRES_SENDERS", "SQLITE_SENDERS", "SenderTables"]
