"""Trigger deliveries on every backend (core/store/trigger_rows.py `TriggerStore`): a
delivery is new once per (trigger, delivery id), also when workers race on it, survives a
restart, is forgotten after the dedupe window, and each trigger's last one is listed."""

from __future__ import annotations

import asyncio

from core.store import Store, TriggerDelivery
from tests.store.conftest import Reopen


def delivery(
    trigger: str, delivery_id: str, at: float = 1000.0, outcome: str = "accepted"
) -> TriggerDelivery:
    return TriggerDelivery(trigger, delivery_id, at, "check_run", outcome)


async def test_a_delivery_is_new_once_and_a_redelivery_after_a_restart_is_a_duplicate(
    reopen: Reopen,
) -> None:
    store = await reopen()
    assert await store.record_delivery(delivery("ci", "d1")) is True
    assert await store.record_delivery(delivery("ci", "d1", at=1001.0, outcome="x")) is False
    await store.aclose()
    store = await reopen()  # another worker, or this one restarted
    assert await store.record_delivery(delivery("ci", "d1", at=1002.0)) is False
    kept = (await store.last_deliveries())["ci"]
    assert kept == delivery("ci", "d1")  # the duplicate changed nothing
    await store.aclose()


async def test_one_delivery_id_under_two_triggers_is_two_new_deliveries(store: Store) -> None:
    assert await store.record_delivery(delivery("ci", "same-id")) is True
    assert await store.record_delivery(delivery("deploys", "same-id")) is True
    assert await store.record_delivery(delivery("deploys", "same-id")) is False
    assert sorted(await store.last_deliveries()) == ["ci", "deploys"]


async def test_of_concurrent_records_of_one_key_on_two_stores_exactly_one_is_new(
    reopen: Reopen,
) -> None:
    first, second = await reopen(), await reopen()  # on PostgreSQL: two pools
    try:
        tries = [
            (first if n % 2 else second).record_delivery(delivery("ci", "raced", at=float(n)))
            for n in range(12)
        ]
        answers = await asyncio.gather(*tries)
        assert answers.count(True) == 1
        assert answers.count(False) == 11
    finally:
        await first.aclose()
        await second.aclose()


async def test_purge_forgets_deliveries_received_before_the_window(store: Store) -> None:
    assert await store.record_delivery(delivery("ci", "old", at=100.0))
    assert await store.record_delivery(delivery("ci", "edge", at=200.0))
    assert await store.record_delivery(delivery("pd", "new", at=300.0))
    assert await store.purge_deliveries(200.0) == 1  # `received_at < before` only
    assert await store.purge_deliveries(200.0) == 0
    assert await store.record_delivery(delivery("ci", "old", at=400.0)) is True  # new again
    assert await store.record_delivery(delivery("ci", "edge", at=400.0)) is False  # still kept


async def test_last_deliveries_gives_each_triggers_latest_with_its_outcome(store: Store) -> None:
    assert await store.last_deliveries() == {}
    await store.record_delivery(delivery("ci", "a", at=10.0))
    await store.record_delivery(delivery("ci", "c", at=30.0, outcome="ignored"))
    await store.record_delivery(delivery("ci", "b", at=20.0))
    await store.record_delivery(
        TriggerDelivery("pd", "p1", 15.0, "incident.triggered", "accepted", run_id="r1")
    )
    last = await store.last_deliveries()
    assert last == {
        "ci": TriggerDelivery("ci", "c", 30.0, "check_run", "ignored"),
        "pd": TriggerDelivery("pd", "p1", 15.0, "incident.triggered", "accepted", "r1"),
    }
