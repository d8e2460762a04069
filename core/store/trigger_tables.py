"""`TriggerStore` written once for both backends (the row and the seam: `trigger_rows.py`).

The dedupe is one `INSERT … ON CONFLICT DO NOTHING RETURNING`: the primary key decides
which of two racing workers stores the delivery, and the returned row says it was this
one — no read-then-write window for a redelivery to slip through."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.trigger_rows import DELIVERY_COLUMNS, TriggerDelivery, trigger_delivery


class TriggerSql:
    """The statements of `TriggerTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect) -> None:
        marks = ", ".join(["?"] * len(DELIVERY_COLUMNS.split(",")))
        self.record = d.sql(
            f"INSERT INTO trigger_deliveries ({DELIVERY_COLUMNS}) VALUES ({marks}) "
            "ON CONFLICT (trigger, delivery_id) DO NOTHING RETURNING 1"
        )
        self.purge = d.sql("DELETE FROM trigger_deliveries WHERE received_at < ? RETURNING 1")
        # Ties on `received_at` may give a trigger two rows: `last_deliveries` keeps one.
        self.last = (
            f"SELECT {DELIVERY_COLUMNS} FROM trigger_deliveries AS d WHERE received_at = "
            "(SELECT MAX(received_at) FROM trigger_deliveries AS e WHERE e.trigger = d.trigger) "
            "ORDER BY trigger, delivery_id"
        )


SQLITE_TRIGGERS = TriggerSql(SQLITE)
POSTGRES_TRIGGERS = TriggerSql(POSTGRES)


class TriggerTables:
    """`TriggerStore` over a database whose statements `_trigger_sql` spells (a backend's
    class puts its database first among its bases)."""

    _trigger_sql: TriggerSql

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def _write_now(self, sql: str, params: Callable[[], Sequence[Any]]) -> list[Any]: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    async def record_delivery(self, delivery: TriggerDelivery) -> bool:
        rows = await self._write_now(self._trigger_sql.record, delivery.params)
        return bool(rows)

    async def purge_deliveries(self, before: float) -> int:
        return len(await self._write_now(self._trigger_sql.purge, lambda: (before,)))

    async def last_deliveries(self) -> dict[str, TriggerDelivery]:
        found: dict[str, TriggerDelivery] = {}
        for row in await self._all(self._trigger_sql.last):
            delivery = trigger_delivery(row)
            found.setdefault(delivery.trigger, delivery)  # of a tie, the first id
        return found


__all__ = ["POSTGRES_TRIGGERS", "SQLITE_TRIGGERS", "TriggerTables"]
