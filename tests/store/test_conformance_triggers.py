"""Trigger deliveries on every backend (core/store/trigger_rows.py `TriggerStore`): a
delivery is new once per (trigger, delivery id), also when workers race on it, survives a
restart, is forgotten after the dedupe window, and each trigger's last one is listed."""

from __future__ import annotations

import asyncio

from core.store import Store, TriggerDelivery
from core.store.trigger_rows import Acceptance, PlatformThread
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


# --- accepted deliveries: their runs, their threads, the shared rate ------------------------


def acceptance(
    delivery_id: str,
    *,
    key: str | None = "repo#sha",
    closes: bool = False,
    trigger: str = "ci",
    conv: str | None = None,
) -> Acceptance:
    return Acceptance(
        delivery(trigger, delivery_id),
        new_conv=conv or f"trigger:{trigger}:{delivery_id}",
        place="slack:C1",
        header=f"ci: {key}",
        runs=((f"run-{trigger}-{delivery_id}", "trigger", f"prompt {delivery_id}"),),
        thread_key=key,
        closes=closes,
    )


async def test_an_accepted_delivery_queues_its_run_in_its_threads_conversation(
    store: Store,
) -> None:
    first = await store.accept_delivery(acceptance("d1"))
    assert first == "trigger:ci:d1"
    assert await store.accept_delivery(acceptance("d1")) is None  # a redelivery: nothing
    second = await store.accept_delivery(acceptance("d2"))
    assert second == first  # the same key: the same conversation
    runs = await store.runs(conv=first, limit=10)
    assert sorted((r.id, r.state, r.trigger, r.text) for r in runs) == [
        ("run-ci-d1", "queued", "trigger", "prompt d1"),
        ("run-ci-d2", "queued", "trigger", "prompt d2"),
    ]
    place = await store.platform_thread(first)
    assert place == PlatformThread(first, "slack:C1", "ci: repo#sha", None)
    assert await store.platform_thread("trigger:ci:d2") is None  # never opened
    other = await store.accept_delivery(acceptance("d3", trigger="deploys"))
    assert other == "trigger:deploys:d3"  # the key is the trigger's own


async def test_close_on_ends_the_correlation_and_the_next_delivery_opens_another(
    store: Store,
) -> None:
    first = await store.accept_delivery(acceptance("d1"))
    closed = await store.accept_delivery(acceptance("d2", closes=True))
    assert closed == first  # the closing delivery still goes to its thread
    again = await store.accept_delivery(acceptance("d3"))
    assert again == "trigger:ci:d3" != first
    alone = await store.accept_delivery(acceptance("d4", key=None))
    assert alone == "trigger:ci:d4"  # no key: a conversation of its own


async def test_an_opened_thread_is_found_by_its_platform_key(store: Store) -> None:
    conv = await store.accept_delivery(acceptance("d1"))
    assert conv is not None
    assert await store.conversation_alias("slack:C1:1700.1") is None
    await store.set_platform_thread(conv, "1700.1", "slack:C1:1700.1")
    assert await store.conversation_alias("slack:C1:1700.1") == conv
    found = await store.platform_thread(conv)
    assert found is not None
    assert found.thread == "1700.1"


async def test_two_workers_racing_to_open_one_key_share_one_conversation(
    reopen: Reopen,
) -> None:
    first, second = await reopen(), await reopen()
    try:
        tries = [
            (first if n % 2 else second).accept_delivery(acceptance(f"d{n}")) for n in range(10)
        ]
        convs = await asyncio.gather(*tries)
        assert len(set(convs)) == 1
        assert len(await first.runs(conv=convs[0], limit=20)) == 10
    finally:
        await first.aclose()
        await second.aclose()


async def test_the_rate_is_counted_once_per_delivery_by_every_worker(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        counts = await asyncio.gather(
            *((first if n % 2 else second).count_delivery("ci", 100) for n in range(8))
        )
        assert sorted(counts) == list(range(1, 9))
        assert await first.count_delivery("ci", 101) == 1  # a new minute
        assert await first.count_delivery("pd", 100) == 1  # another trigger
        await first.purge_deliveries(102 * 60.0)
        assert await first.count_delivery("ci", 100) == 1  # forgotten with the window
    finally:
        await first.aclose()
        await second.aclose()
