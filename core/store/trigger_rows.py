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


@record(frozen=True, slots=True)
class Acceptance:
    """What an accepted delivery stores, in one transaction with its row
    (`TriggerStore.accept_delivery`): the queued runs it starts, in order — each `(run id,
    kind, text)`, kind `trigger` (a model run) or `post` (text posted as it is) — in the
    conversation of its thread.

    With a `thread_key`, the conversation is the one the trigger's open correlation of
    that key has, else `new_conv` (which then opens it); without, always `new_conv`. A new
    conversation is recorded as posting at `place` (`slack:C0123`) under `header` (the
    line that opens its platform thread). `closes`: the correlation ends with this
    delivery (`close_on`): a later delivery of the key opens a new thread."""

    delivery: TriggerDelivery
    new_conv: str
    place: str
    header: str
    runs: tuple[tuple[str, str, str], ...]
    thread_key: str | None = None
    closes: bool = False


@record(frozen=True, slots=True)
class PlatformThread:
    """Where a trigger conversation posts: `place` (`slack:C0123`), the line that opens
    its platform thread, and that thread's id once it is open (None before)."""

    conv: str
    place: str
    header: str
    thread: str | None


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

    async def recent_deliveries(self, limit: int) -> list[TriggerDelivery]:
        """The latest `limit` deliveries of every trigger, newest first."""
        ...

    async def accept_delivery(self, accepted: Acceptance) -> str | None:
        """Committed, in one transaction: the delivery's row (as `record_delivery`), the
        conversation of its thread (see `Acceptance`) and its queued runs there, of no
        worker. The conversation; None for a duplicate (then nothing is stored). Of two
        deliveries racing to open one key, both get the same conversation."""
        ...

    async def count_delivery(self, trigger: str, minute: int) -> int:
        """Committed, in one statement: one more delivery of `trigger` in `minute` (whole
        minutes since the epoch); how many that minute has now, counted by every worker."""
        ...

    async def platform_thread(self, conv: str) -> PlatformThread | None:
        """Where trigger conversation `conv` posts; None if it is not one."""
        ...

    async def set_platform_thread(self, conv: str, thread: str, alias: str) -> None:
        """Committed: `conv`'s platform thread is open as `thread`, and people's messages
        in it (conversation key `alias`) belong to `conv`."""
        ...

    async def conversation_alias(self, alias: str) -> str | None:
        """The trigger conversation whose platform thread has conversation key `alias`."""
        ...


__all__ = [
    "DELIVERY_COLUMNS",
    "Acceptance",
    "PlatformThread",
    "TriggerDelivery",
    "TriggerStore",
    "trigger_delivery",
]
