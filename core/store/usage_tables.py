"""`UsageStore` for both backends (docs/cost.md): the statements are written once; only
the reservation's transaction is each backend's own (`reserve_budget` below: SQLite holds
its write lock, PostgreSQL locks the periods' rows)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.usage_rows import CALL_COLUMNS, LlmCall, Refused, Want, llm_call

EPSILON = 1e-9  # floating-point slack when a reservation meets its limit exactly


class UsageSql:
    """The statements of `UsageTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        marks = ", ".join(["?"] * len(CALL_COLUMNS.split(",")))
        self.insert_call = d.sql(f"INSERT INTO llm_calls ({CALL_COLUMNS}) VALUES ({marks})")
        self.calls = d.sql(f"SELECT {CALL_COLUMNS} FROM llm_calls WHERE at >= ? ORDER BY at, id")
        self.conv_calls = d.sql(
            f"SELECT {CALL_COLUMNS} FROM llm_calls WHERE at >= ? AND conv = ? ORDER BY at, id"
        )
        self.new_period = d.sql(
            "INSERT INTO budget_spend (key, spent, updated_at) VALUES (?, 0, ?) "
            "ON CONFLICT (key) DO NOTHING"
        )
        self.add = d.sql("UPDATE budget_spend SET spent = spent + ?, updated_at = ? WHERE key = ?")
        self.set_limit = d.upsert("budget_limits", "name, amount, set_by, updated_at", "name")
        self.limits = "SELECT name, amount FROM budget_limits"


SQLITE_USAGE = UsageSql(SQLITE)
POSTGRES_USAGE = UsageSql(POSTGRES)


def refusal(wants: Sequence[Want], spent: dict[str, float]) -> Refused | None:
    """The first reservation that would take its period past its limit, if any."""
    for key, amount, limit in wants:
        held = spent.get(key, 0.0)
        if held + amount > limit + EPSILON:
            return Refused(key, held)
    return None


class UsageTables:
    """`UsageStore` but `reserve_budget`, over a database whose statements `_usage_sql`
    spells (a backend's class puts its database first among its bases)."""

    _usage_sql: UsageSql

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def write(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def record_llm_call(self, call: LlmCall) -> None:
        self.write_soon(self._usage_sql.insert_call, call.params())

    async def llm_calls(self, since: float, *, conv: str | None = None) -> list[LlmCall]:
        sql = self._usage_sql
        if conv is None:
            rows = await self._all(sql.calls, (since,))
        else:
            rows = await self._all(sql.conv_calls, (since, conv))
        return [llm_call(r) for r in rows]

    def settle_budget(self, keys: Sequence[str], delta: float) -> None:
        now = time.time()
        for key in keys:
            self.write_soon(self._usage_sql.add, (delta, now, key))

    async def budget_spent(self, keys: Sequence[str]) -> dict[str, float]:
        if not keys:
            return {}
        where, params = self._usage_sql.dialect.in_list("key", list(keys))
        sql = self._usage_sql.dialect.sql(f"SELECT key, spent FROM budget_spend WHERE {where}")
        return {str(r[0]): float(r[1]) for r in await self._all(sql, params)}

    async def set_budget_limit(self, name: str, amount: float, by: str) -> None:
        await self.write(self._usage_sql.set_limit, (name, amount, by, time.time()))

    async def budget_limits(self) -> dict[str, float]:
        return {str(r[0]): float(r[1]) for r in await self._all(self._usage_sql.limits)}


__all__ = ["POSTGRES_USAGE", "SQLITE_USAGE", "UsageTables", "refusal"]
