"""What every `Store` backend promises the shared mode of the agent (docs/scale-out.md; see
test_conformance_workers.py): runs owned by a worker, a dead worker's runs taken over once,
an interrupted run resumed by one worker, queued runs dropped by `/stop`, and the tool
process-group ledger scoped to a machine's dead workers."""

from __future__ import annotations

import asyncio

from core.store import Store
from tests.store.conftest import Reopen
from tests.store.samples import CONV, OTHER, checkpoint

# --- whose runs ----------------------------------------------------------------------------


async def test_runs_are_their_worker_s_and_only_shared_queued_ones_are_claimed(
    store: Store,
) -> None:
    await store.create_run("nobody", CONV, "user")  # no worker set: one process
    store.set_worker("w1")
    await store.create_run("mine", CONV, "cron")
    await store.create_run("pinned", OTHER, "user", state="queued")  # a console's message
    await store.create_run("anyone", "test:c3:", "user", state="queued", shared=True)
    assert [(await store.run(r)).worker for r in ("nobody", "mine", "pinned", "anyone")] == [  # type: ignore[union-attr]
        None,
        "w1",
        "w1",
        None,
    ]
    claimed = await store.claim_queued_run("w2")
    assert claimed is not None
    assert (claimed.id, claimed.worker) == ("anyone", "w2")
    assert await store.claim_queued_run("w2") is None  # the pinned one is w1's own


async def test_a_claimed_run_that_never_began_goes_back_to_the_queue(store: Store) -> None:
    await store.create_run("r1", CONV, "user", state="queued", text="hi", shared=True)
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    await store.unclaim_run("r1")
    again = await store.claim_queued_run("w2")
    assert again is not None
    assert (again.id, again.worker, again.text) == ("r1", "w2", "hi")
    store.set_run_state("r1", "completed", "done")
    await store.unclaim_run("r1")  # no longer running: it stays as it is
    assert (await store.run("r1")).state == "completed"  # type: ignore[union-attr]


async def test_a_resumed_run_becomes_the_resuming_worker_s(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "timed_out", "interrupted", resumable=True)
    store.set_worker("w2")
    store.resume_run("r1")
    await store.flush()
    run = await store.run("r1")
    assert run is not None
    assert (run.state, run.worker, run.resumable) == ("running", "w2", False)


# --- dead workers ------------------------------------------------------------------------


async def test_a_dead_worker_s_running_runs_are_taken_over_once(reopen: Reopen) -> None:
    dead, first, second = await reopen(), await reopen(), await reopen()
    try:
        dead.set_worker("dead")
        await dead.create_run("mid", CONV, "user")
        dead.checkpoint(checkpoint("mid", 1, "llm_response"))
        await dead.create_run("done", OTHER, "user")
        dead.checkpoint(checkpoint("done", 1, "final"))
        await dead.create_run("fresh", "test:c3:", "user")  # no checkpoint: never got going
        await dead.create_run("cron", "test:c6:", "cron")  # nor this one, but it is no message
        await dead.create_run("queued", "test:c4:", "user", state="queued", shared=True)
        await dead.create_run("ended", "test:c5:", "user")
        dead.set_run_state("ended", "completed", "done")
        await dead.flush()
        taken = await asyncio.gather(
            *(s.take_over_runs("dead", f"w{i}") for i, s in enumerate([first, second] * 3))
        )
        won = [runs for runs in taken if runs]
        assert len(won) == 1, "two workers took over the same runs"
        [runs] = won
        assert [(r.id, r.state) for r in runs] == [
            ("mid", "timed_out"),
            ("done", "timed_out"),
            ("fresh", "queued"),
            ("cron", "timed_out"),
        ]
        interrupted = [r for r in runs if r.state == "timed_out"]
        assert {r.reason for r in interrupted} == {"interrupted"}
        assert [r.resumable for r in interrupted] == [True, False, False]
        assert len({r.worker for r in interrupted}) == 1
        assert interrupted[0].worker in ("w0", "w1")
        fresh = await first.run("fresh")
        assert fresh is not None
        assert (fresh.worker, fresh.started_at, fresh.ended_at) == (None, None, None)
        assert (await first.run("queued")).state == "queued"  # type: ignore[union-attr]
        assert (await first.run("ended")).state == "completed"  # type: ignore[union-attr]
        claimed = {(await first.claim_queued_run("w0")).id for _ in range(2)}  # type: ignore[union-attr]
        assert claimed == {"queued", "fresh"}
    finally:
        for opened in (dead, first, second):
            await opened.aclose()


async def test_runs_of_no_worker_are_taken_over_only_if_older(store: Store) -> None:
    await store.create_run("old", CONV, "user")
    store.checkpoint(checkpoint("old", 1, "input"))
    store.set_worker("live")
    await store.create_run("live's", OTHER, "user")
    await store.flush()
    cutoff = (await store.run("old")).created_at + 1e-6  # type: ignore[union-attr]
    runs = await store.take_over_runs(None, "w1", created_before=cutoff)
    assert [(r.id, r.resumable, r.worker) for r in runs] == [("old", True, "w1")]
    assert (await store.run("live's")).state == "running"  # type: ignore[union-attr]


# --- /resume and /stop -------------------------------------------------------------------


async def test_an_interrupted_run_is_resumed_by_one_worker(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        await first.create_run("r1", CONV, "user")
        first.set_run_state("r1", "timed_out", "interrupted", resumable=True)
        await first.flush()
        took = await asyncio.gather(
            *(s.take_resumable_run("r1", f"w{i}") for i, s in enumerate([first, second] * 3))
        )
        assert took.count(True) == 1
        run = await first.run("r1")
        assert run is not None
        assert (run.state, run.resumable, run.ended_at) == ("running", False, None)
        assert run.worker == f"w{took.index(True) % 2}"
        assert not await first.take_resumable_run("r1", "w9")  # running now
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_interrupted_run_waits_while_its_conversation_has_input(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "timed_out", "interrupted", resumable=True)
    await store.create_run("r2", CONV, "user", state="queued", shared=True)
    assert not await store.take_resumable_run("r1", "w1")
    await store.create_run("r3", CONV, "user")
    store.set_run_state("r3", "completed", "done")
    store.set_run_state("r2", "completed", "done")
    await store.flush()
    assert await store.take_resumable_run("r1", "w1")
    assert not await store.take_resumable_run("r3", "w1")  # never resumable


async def test_stop_drops_a_conversation_s_queued_runs_in_order(store: Store) -> None:
    for run_id in ("q1", "q2", "q3"):
        await store.create_run(run_id, CONV, "user", state="queued", shared=True)
    await store.create_run("other", OTHER, "user", state="queued", shared=True)
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert claimed.id == "q1"
    assert await store.cancel_queued(CONV, "dropped by /stop") == ["q2", "q3"]
    dropped = await store.run("q2")
    assert dropped is not None
    assert (dropped.state, dropped.reason) == ("cancelled", "dropped by /stop")
    assert (await store.run("q1")).state == "running"  # type: ignore[union-attr]
    assert (await store.run("other")).state == "queued"  # type: ignore[union-attr]
    assert await store.cancel_queued(CONV, "dropped by /stop") == []


async def test_one_queued_run_is_withdrawn_unless_claimed(store: Store) -> None:
    for run_id in ("q1", "q2", "q3"):
        await store.create_run(run_id, CONV, "goal", state="queued", shared=True)
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert await store.cancel_queued(CONV, "withdrawn", run_id="q1") == []  # claimed
    assert await store.cancel_queued(CONV, "withdrawn", run_id="q2") == ["q2"]
    assert await store.cancel_queued(OTHER, "withdrawn", run_id="q3") == []
    assert [(r.id, r.state) for r in await store.runs(conv=CONV)] == [
        ("q3", "queued"),
        ("q2", "cancelled"),
        ("q1", "running"),
    ]


# --- the tool process-group ledger ------------------------------------------------------


async def test_tool_groups_are_taken_only_from_this_machine_s_silent_workers(
    reopen: Reopen,
) -> None:
    opened = [await reopen() for _ in range(4)]
    live, dead, remote, taker = opened
    try:
        live.set_worker("hostA:1:aa")
        dead.set_worker("hostA:2:bb")
        remote.set_worker("hostB:3:cc")
        await live.worker_heartbeat("hostA:1:aa")
        await dead.worker_heartbeat("hostA:2:bb")
        live.tool_group_started(101, 1, "boot")
        dead.tool_group_started(102, 2, "boot")
        dead.tool_group_started(103, 3, "boot")
        dead.tool_group_ended(103)
        live.tool_group_ended(102)  # not its group: stays listed
        remote.tool_group_started(104, 4, "boot-b")
        for s in opened:
            await s.flush()
        await asyncio.sleep(0.3)
        await live.worker_heartbeat("hostA:1:aa")
        assert await taker.take_tool_groups(host="hostA", stale=0.2) == [(102, 2, "boot")]
        assert await taker.take_tool_groups(host="hostA", stale=0.2) == []
        await dead.forget_worker("hostA:1:aa")  # gone from the list: its groups are leftovers
        assert await taker.take_tool_groups(host="hostA", stale=3600) == [(101, 1, "boot")]
        assert await taker.take_tool_groups() == [(104, 4, "boot-b")]  # one process: all
    finally:
        for s in opened:
            await s.aclose()
