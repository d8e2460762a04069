"""Trigger deliveries (docs/triggers.md#deliveries-in-the-store): each webhook delivery a
trigger took in, keyed by (trigger, delivery id), so that a redelivery — to this worker
or another — is told from a new one. The row, and the `TriggerStore` seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from core.records import record

DELIVERY_COLUMNS = "trigger, delivery_id, received_at, event_type, outcome, run_id"


@record(frozen=True, slots=True)
class TriggerDelivery:
    """One delivery a trigger took in: when, its event type, what became of it
    (`accepted`, `ignored`, …) and the run it started, if any."""

    trigger: str
    delivery_id: str
    received_at: float
    event_type: str
    outcome: str
    run_id: str | None = None

    def params(self) -> tuple[Any, ...]:
        return (
            self.trigger,
            self.delivery_id,
            self.received_at,
            self.event_type,
            self.outcome,
            self.run_id,
        )


def trigger_delivery(row: Sequence[Any]) -> TriggerDelivery:
    run_id = None if row[5] is None else str(row[5])
    return TriggerDelivery(
        str(row[0]), str(row[1]), float(row[2]), str(row[3]), str(row[4]), run_id
    )


class TriggerStore(Protocol):
    """The deliveries triggers took in: the dedupe of redeliveries, kept for a window."""

    async def record_delivery(self, delivery: TriggerDelivery) -> bool:
        """Committed, in one statement: store `delivery` unless one with its (trigger,
        delivery id) is stored already; True if it was new, False for a duplicate (the
        stored row is left as it was). Of several stores racing on one key, exactly one
        gets True; the same delivery id under two triggers is two new deliveries."""
        ...

    async def purge_deliveries(self, before: float) -> int:
        """Committed: forget the deliveries received before `before` (now less the
        dedupe window), so that a redelivery after it counts as new; how many."""
        ...

    async def last_deliveries(self) -> dict[str, TriggerDelivery]:
        """Each trigger's latest delivery (by `received_at`), by trigger name."""
        ...


__all__ = ["DELIVERY_COLUMNS", "TriggerDelivery", "TriggerStore", "trigger_delivery"]
