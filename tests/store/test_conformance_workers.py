"""What every `Store` backend promises to several workers (docs/scale-out.md; see
test_conformance.py): queued runs handed out one at a time per conversation and in order,
heartbeats, leases. Through the protocol only; several workers are several stores opened
on the same data (`reopen`)."""

from __future__ import annotations

import asyncio
import time

from core.store import Store
from tests.store.conftest import Reopen, shared_only
from tests.store.samples import CONV, OTHER

# --- queued runs -------------------------------------------------------------------------


async def test_no_queued_run_no_claim(store: Store) -> None:
    assert await store.claim_queued_run("w1") is None
    await store.create_run("r1", CONV, "user")  # running, not queued
    assert await store.claim_queued_run("w1") is None


async def test_the_oldest_queued_run_is_claimed_running_on_the_worker(store: Store) -> None:
    await store.create_run("r1", CONV, "user", state="queued", text="first")
    await store.create_run("r2", OTHER, "user", state="queued", text="second")
    before = time.time()
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert (claimed.id, claimed.state, claimed.worker, claimed.text) == (
        "r1",
        "running",
        "w1",
        "first",
    )
    assert claimed.started_at is not None
    assert before <= claimed.started_at <= time.time()
    assert await store.run("r1") == claimed
    other = await store.claim_queued_run("w2")
    assert other is not None
    assert (other.id, other.worker) == ("r2", "w2")
    assert await store.claim_queued_run("w1") is None


async def test_a_conversation_runs_one_claimed_run_at_a_time_in_order(store: Store) -> None:
    for run_id in ("r1", "r2", "r3"):
        await store.create_run(run_id, CONV, "user", state="queued")
    first = await store.claim_queued_run("w1")
    assert first is not None
    assert first.id == "r1"
    assert await store.claim_queued_run("w2") is None  # r1 runs
    store.finish_run(
        "r1", state="completed", reason="", text="ok", iterations=1, input_tokens=1,
        output_tokens=1,
    )  # fmt: skip
    second = await store.claim_queued_run("w2")  # also commits the queued finish first
    assert second is not None
    assert second.id == "r2"


async def test_a_conversation_with_a_running_run_is_passed_over(store: Store) -> None:
    await store.create_run("busy", CONV, "user")
    await store.create_run("waits", CONV, "user", state="queued")
    await store.create_run("free", OTHER, "user", state="queued")
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert claimed.id == "free"
    assert await store.claim_queued_run("w1") is None
    store.set_run_state("busy", "cancelled", "dropped by /stop")
    await store.flush()
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert claimed.id == "waits"


async def test_workers_claiming_at_once_keep_each_conversation_to_one_run_in_order(
    reopen: Reopen,
) -> None:
    workers = [await reopen() for _ in range(3)]
    try:
        created: dict[str, list[str]] = {}
        for n in range(4):
            for conv in ("a", "b", "c"):
                run_id = f"{conv}{n}"
                await workers[0].create_run(run_id, conv, "user", state="queued")
                created.setdefault(conv, []).append(run_id)
        handed: dict[str, list[str]] = {conv: [] for conv in created}
        while any(len(handed[c]) < len(created[c]) for c in created):
            claims = await asyncio.gather(
                *(w.claim_queued_run(f"w{i}") for i, w in enumerate(workers) for _ in range(2))
            )
            runs = [run for run in claims if run is not None]
            assert runs, "nothing was handed out while runs were queued"
            convs = [run.conv for run in runs]
            assert len(convs) == len(set(convs)), f"two runs of one conversation at once: {runs}"
            for run in runs:
                handed[run.conv].append(run.id)
                workers[1].set_run_state(run.id, "completed", "done")
            await workers[1].flush()
        assert handed == created
    finally:
        for worker in workers:
            await worker.aclose()


@shared_only
async def test_a_queued_run_for_an_event_is_created_once_and_marks_it_seen(
    store: Store,
) -> None:
    assert await store.create_queued_run("r1", CONV, "hi", channel="slack", event_id="ev1")
    assert await store.seen("slack", "ev1")
    run = await store.run("r1")
    assert run is not None
    assert (run.state, run.trigger, run.text, run.worker, run.started_at) == (
        "queued",
        "user",
        "hi",
        None,
        None,
    )
    assert not await store.create_queued_run("r2", CONV, "hi", channel="slack", event_id="ev1")
    assert await store.run("r2") is None
    await store.mark_seen("slack", "ev2")  # seen before (a command, say): no run either
    assert not await store.create_queued_run("r3", CONV, "hi", channel="slack", event_id="ev2")
    assert await store.create_queued_run("r4", CONV, "hi", channel="discord", event_id="ev1")


@shared_only
async def test_workers_taking_one_event_in_at_once_create_one_run(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        for n in range(5):
            created = await asyncio.gather(
                *(
                    s.create_queued_run(f"r{n}.{i}", CONV, "hi", channel="slack", event_id=f"e{n}")
                    for i, s in enumerate([first, second] * 2)
                )
            )
            assert created.count(True) == 1
        assert len(await first.runs(limit=100)) == 5
    finally:
        await first.aclose()
        await second.aclose()


# --- heartbeats ------------------------------------------------------------------------


@shared_only
async def test_workers_not_heard_from_are_dead_longest_silent_first(store: Store) -> None:
    assert await store.dead_workers(0) == []
    await store.worker_heartbeat("w1")
    await store.worker_heartbeat("w2")
    assert await store.dead_workers(3600) == []
    assert await store.dead_workers(0) == ["w1", "w2"]
    await store.worker_heartbeat("w1")
    assert await store.dead_workers(0) == ["w2", "w1"]
    await store.forget_worker("w2")
    assert await store.dead_workers(0) == ["w1"]


@shared_only
async def test_worker_states_list_workers_with_their_heartbeats_and_leases(
    reopen: Reopen,
) -> None:
    """Two workers (two stores on one schema) beat and hold leases; each store lists both,
    the most recently heard from first, with the unexpired leases each holds — and a
    lease whose holder is no longer listed, last."""
    first, second = await reopen(), await reopen()
    try:
        assert await first.worker_states() == []
        await first.worker_heartbeat("w1")
        assert await first.take_lease("telegram", "w1", 60)
        assert await first.take_lease("scheduler", "w1", 60)
        assert await second.take_lease("expired", "w2", 0.001)
        await asyncio.sleep(0.05)
        await second.worker_heartbeat("w2")
        assert await second.take_lease("discord:0", "w2", 60)
        assert await second.take_lease("orphan", "gone", 60)  # a holder never listed
        for seen_by in (first, second):
            states = await seen_by.worker_states()
            assert [s.id for s in states] == ["w2", "w1", "gone"]
            w2, w1, gone = states
            assert [name for name, _ in w1.leases] == ["scheduler", "telegram"]
            assert [name for name, _ in w2.leases] == ["discord:0"]  # not the expired one
            assert all(0 < left <= 60 for _, left in w1.leases + w2.leases)
            assert w2.beat_age is not None
            assert w1.beat_age is not None
            assert 0 <= w2.beat_age < w1.beat_age < 3600
            assert w1.up_for is not None
            assert w1.up_for >= w1.beat_age
            assert (gone.beat_age, gone.up_for, [n for n, _ in gone.leases]) == (
                None,
                None,
                ["orphan"],
            )
        await first.forget_worker("w1")
        # struck off, w1 still holds its leases: listed among the unlisted holders, by id
        states = await second.worker_states()
        assert [(s.id, s.beat_age is None) for s in states] == [
            ("w2", False),
            ("gone", True),
            ("w1", True),
        ]
    finally:
        await first.aclose()
        await second.aclose()


# --- leases ----------------------------------------------------------------------------


@shared_only
async def test_a_lease_is_held_by_one_holder_until_released(store: Store) -> None:
    assert await store.take_lease("telegram", "w1", 60)
    assert not await store.take_lease("telegram", "w2", 60)
    assert await store.take_lease("telegram", "w1", 60)  # its own: taken again
    assert await store.take_lease("scheduler", "w2", 60)  # another lease
    await store.release_lease("telegram", "w2")  # not its: nothing happens
    assert not await store.take_lease("telegram", "w2", 60)
    await store.release_lease("telegram", "w1")
    assert await store.take_lease("telegram", "w2", 60)


@shared_only
async def test_an_expired_lease_goes_to_the_next_taker(store: Store) -> None:
    assert await store.take_lease("telegram", "w1", 0.2)
    await asyncio.sleep(0.4)
    assert await store.take_lease("telegram", "w2", 60)
    assert not await store.renew_lease("telegram", "w1", 60)


@shared_only
async def test_a_renewed_lease_stays_with_its_holder(store: Store) -> None:
    assert not await store.renew_lease("telegram", "w1", 60)  # nobody holds it
    assert await store.take_lease("telegram", "w1", 0.2)
    assert await store.renew_lease("telegram", "w1", 60)
    await asyncio.sleep(0.4)  # past the first ttl, within the renewed one
    assert not await store.take_lease("telegram", "w2", 60)
    assert not await store.renew_lease("telegram", "w2", 60)


@shared_only
async def test_holders_taking_one_lease_at_once_get_it_once(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        taken = await asyncio.gather(
            *(s.take_lease("scheduler", f"w{i}", 60) for i, s in enumerate([first, second] * 4))
        )
        assert taken.count(True) == 1
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_owed_reply_goes_to_one_taker_until_it_is_delivered(store: Store) -> None:
    import math

    await store.create_run("r1", CONV, "user", text="hi")  # a single process's: no worker
    store.finish_run(
        "r1",
        state="completed",
        reason="final",
        text="hello",
        iterations=1,
        input_tokens=1,
        output_tokens=1,
    )
    store.owe_reply("r1", "hello")
    await store.flush()
    assert await store.take_owed_replies("w:1", None, created_before=math.inf) == []
    [owed] = await store.take_owed_replies(None, "w:2", created_before=math.inf)
    assert (owed.run_id, owed.conv, owed.text) == ("r1", CONV, "hello")
    assert await store.take_owed_replies(None, "w:3", created_before=math.inf) == []  # taken
    assert await store.take_owed_replies("w:2", "w:3", created_before=0.0) == []  # too new
    await store.reply_delivered("r1")
    assert await store.take_owed_replies("w:2", "w:3", created_before=math.inf) == []


async def test_a_reply_is_owed_only_by_the_worker_whose_run_it_is(store: Store) -> None:
    import math

    await store.create_run("r1", CONV, "user", state="queued", text="hi", shared=True)
    store.set_worker("w:1")
    assert await store.claim_queued_run("w:1") is not None
    store.set_worker("w:2")  # a worker the run is not (any more) with
    store.owe_reply("r1", "hello")
    await store.flush()
    assert await store.take_owed_replies("w:1", "w:3", created_before=math.inf) == []
    store.set_worker("w:1")
    store.owe_reply("r1", "hello")
    await store.flush()
    [owed] = await store.take_owed_replies("w:1", "w:3", created_before=math.inf)
    assert owed.text == "hello"


@shared_only
async def test_an_owed_reply_of_a_listed_worker_stays_its_own(store: Store) -> None:
    """A worker that beats (say, one a sweep found silent a moment ago, that beat since)
    is posting its answers itself: nobody takes them."""
    import math

    store.set_worker("w:1")
    await store.worker_heartbeat("w:1")
    await store.create_run("r1", CONV, "user", text="hi")
    store.finish_run(
        "r1", state="completed", reason="final", text="hello", iterations=1,
        input_tokens=1, output_tokens=1,
    )  # fmt: skip
    store.owe_reply("r1", "hello")
    await store.flush()
    assert await store.take_owed_replies("w:1", "w:2", created_before=math.inf) == []
    await store.take_over_runs("w:1", "w:2")  # struck off
    [owed] = await store.take_owed_replies("w:1", "w:2", created_before=math.inf)
    assert owed.run_id == "r1"
