"""What every `Store` backend promises the shared mode of the agent (docs/scale-out.md; see
test_conformance_workers.py): runs owned by a worker, a dead worker's runs taken over once,
an interrupted run resumed by one worker, queued runs dropped by `/stop`, and the tool
process-group ledger scoped to a machine's dead workers."""

from __future__ import annotations

import asyncio

from core.messages import Message
from core.store import Store
from tests.store.conftest import Reopen, shared_only
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


@shared_only
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
        await dead.create_run("goal", "test:c7:", "goal")  # a goal's turn: queued again too
        await dead.create_run("child", "test:c8:", "child", parent_run_id="mid")
        dead.checkpoint(checkpoint("child", 1, "llm_response"))
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
        # Still running, now the taker's: nothing of their conversations runs before it
        # has gone on with them.
        assert [(r.id, r.state, r.reason) for r in runs] == [
            ("mid", "running", "taken_over"),
            ("done", "running", "taken_over"),
            ("fresh", "queued", None),
            ("cron", "running", "taken_over"),
            ("goal", "queued", None),
            ("child", "timed_out", "interrupted"),  # its parent's resume goes on with it
        ]
        held = [r for r in runs if r.state != "queued"]
        assert [r.resumable for r in held] == [True, False, False, True]
        assert len({r.worker for r in held}) == 1
        assert held[0].worker in ("w0", "w1")
        assert [r.ended_at is None for r in held] == [True, True, True, False]
        fresh = await first.run("fresh")
        assert fresh is not None
        assert (fresh.worker, fresh.started_at, fresh.ended_at) == (None, None, None)
        assert (await first.run("queued")).state == "queued"  # type: ignore[union-attr]
        assert (await first.run("ended")).state == "completed"  # type: ignore[union-attr]
        claimed = {(await first.claim_queued_run("w0")).id for _ in range(3)}  # type: ignore[union-attr]
        assert claimed == {"queued", "fresh", "goal"}
    finally:
        for opened in (dead, first, second):
            await opened.aclose()


@shared_only
async def test_a_worker_that_beats_again_keeps_its_runs(reopen: Reopen) -> None:
    """The takeover and the dead worker's heartbeat cannot both win: the worker is struck
    off with its runs in one commit, only while it is still silent, and its next
    heartbeat says that it was."""
    slow, taker = await reopen(), await reopen()
    try:
        slow.set_worker("slow")
        assert not await slow.worker_heartbeat("slow")  # new: not listed before
        assert await slow.worker_heartbeat("slow")  # listed: kept
        await slow.create_run("r1", CONV, "user")
        slow.checkpoint(checkpoint("r1", 1))
        await slow.flush()
        assert await taker.take_over_runs("slow", "taker", silent_for=3600) == []  # not silent
        assert (await taker.run("r1")).worker == "slow"  # type: ignore[union-attr]
        assert await slow.worker_heartbeat("slow")  # nothing happened to it
        await asyncio.sleep(0.05)
        [run] = await taker.take_over_runs("slow", "taker", silent_for=0.01)
        assert (run.id, run.worker) == ("r1", "taker")
        assert await taker.dead_workers(0) == []  # struck off with its runs
        assert await taker.take_over_runs("slow", "other", silent_for=0.01) == []
        assert not await slow.worker_heartbeat("slow")  # it was taken for dead
        assert await slow.worker_heartbeat("slow")
    finally:
        await slow.aclose()
        await taker.aclose()


@shared_only
async def test_a_worker_taken_for_dead_writes_nothing_over_its_taken_runs(
    reopen: Reopen,
) -> None:
    slow, taker = await reopen(), await reopen()
    try:
        slow.set_worker("slow")
        await slow.create_run("r1", CONV, "user")
        slow.checkpoint(checkpoint("r1", 1))
        slow.save_messages(CONV, [Message.user("hi")], run_id="r1")
        await slow.flush()
        await taker.take_over_runs("slow", "taker")
        slow.checkpoint(checkpoint("r1", 2, "final"))
        slow.save_messages(CONV, [Message.user("hi"), Message.assistant("late")], run_id="r1")
        slow.save_messages(CONV, [], run_id="r1")  # nor drops what is there
        slow.mark_resumable("r1")
        slow.finish_run(
            "r1", state="completed", reason="final", text="late", iterations=1,
            input_tokens=1, output_tokens=1,
        )  # fmt: skip
        await slow.flush()
        assert (await taker.last_checkpoint("r1")).seq == 1  # type: ignore[union-attr]
        assert [m.content for m in await taker.load_messages(CONV)] == ["hi"]
        run = await taker.run("r1")
        assert run is not None
        assert (run.state, run.worker, run.resumable) == ("running", "taker", True)
        taker.set_worker("taker")
        taker.checkpoint(checkpoint("r1", 2))
        taker.save_messages(CONV, [Message.user("hi"), Message.assistant("ok")], run_id="r1")
        await taker.flush()
        assert (await taker.last_checkpoint("r1")).seq == 2  # type: ignore[union-attr]
        assert [m.content for m in await taker.load_messages(CONV)] == ["hi", "ok"]
    finally:
        await slow.aclose()
        await taker.aclose()


@shared_only
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


async def test_a_paused_run_holds_its_queue_until_resumed_or_skipped(store: Store) -> None:
    """An interrupted run that may not go on by itself (`waiting_on_human`, resumable)
    holds the messages behind it: none is handed out, and `/resume` takes it all the
    same; once it ends (or is skipped) the next message goes."""
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "waiting_on_human", "interrupted", resumable=True)
    await store.create_run("r2", CONV, "user", state="queued", shared=True)
    await store.create_run("r3", OTHER, "user", state="queued", shared=True)
    await store.flush()
    claimed = await store.claim_queued_run("w1")
    assert claimed is not None
    assert claimed.id == "r3"  # another conversation's goes
    assert await store.claim_queued_run("w1") is None
    assert await store.take_resumable_run("r1", "w1")
    assert await store.claim_queued_run("w1") is None  # running now
    store.set_run_state("r1", "cancelled", "skipped", resumable=False)
    next_ = await store.claim_queued_run("w1")
    assert next_ is not None
    assert next_.id == "r2"
    store.set_run_state("r2", "waiting_on_human", "asked a question")  # not resumable
    await store.create_run("r4", CONV, "user", state="queued", shared=True)
    assert (await store.claim_queued_run("w1")).id == "r4"  # type: ignore[union-attr]


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


@shared_only
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


# --- scheduled fires ------------------------------------------------------------------------


async def test_a_fire_is_its_claimer_s_and_only_it_finishes_it(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        first.set_worker("w1")
        second.set_worker("w2")
        fire = await first.claim_job_fire("report", 1000.0)
        assert fire is not None
        [row] = await first.job_runs("report")
        assert (row["job"], row["worker"], row["state"]) == ("report", "w1", "running")

        async def finish(store: Store) -> bool:
            return await store.finish_job_run(
                fire, state="completed", run_id="r1", result="ok", delivered=True, error=None
            )

        assert not await finish(second)
        assert (await first.job_runs("report"))[0]["state"] == "running"
        assert await finish(first)
        assert not await finish(first)
        assert (await first.job_runs("report"))[0]["state"] == "completed"
    finally:
        await first.aclose()
        await second.aclose()


@shared_only
async def test_the_fires_of_a_gone_worker_are_taken_over_once(reopen: Reopen) -> None:
    """A fire is taken over when its worker is no longer listed, or listed again only
    since the claim (it was taken for dead meanwhile); a live worker's fire stays."""
    live, dead, lapsed, first, second = [await reopen() for _ in range(5)]
    try:
        for store, worker in ((live, "live"), (dead, "dead"), (lapsed, "lapsed")):
            store.set_worker(worker)
            await store.worker_heartbeat(worker)
        await live.claim_job_fire("report", 1000.0)
        await dead.claim_job_fire("report", 2000.0)
        await lapsed.claim_job_fire("report", 3000.0)
        done = await live.claim_job_fire("report", 4000.0)
        assert done is not None
        await live.finish_job_run(
            done, state="completed", run_id="r1", result="ok", delivered=True, error=None
        )
        for store, worker in ((first, "w0"), (second, "w1")):
            await store.worker_heartbeat(worker)
        assert await first.take_over_fires("w1") == []  # every claimer is listed
        await first.take_over_runs("dead", "w1")  # struck off
        await first.take_over_runs("lapsed", "w1")
        await asyncio.sleep(0.01)
        assert not await lapsed.worker_heartbeat("lapsed")  # listed again since its claim
        taken = await asyncio.gather(
            *(s.take_over_fires(f"w{i}") for i, s in enumerate([first, second] * 3))
        )
        won = [fires for fires in taken if fires]
        assert len(won) == 1, "two workers took over the same fires"
        [fires] = won
        assert [(f["fire_time"], f["state"]) for f in fires] == [
            (2000.0, "running"),
            (3000.0, "running"),
        ]
        assert {f["worker"] for f in fires} in ({"w0"}, {"w1"})
        # the taker finishes them; their claimers no longer can
        assert not await dead.finish_job_run(
            fires[0]["id"], state="failed", run_id=None, result=None, delivered=False, error="x"
        )
    finally:
        for store in (live, dead, lapsed, first, second):
            await store.aclose()


async def test_a_single_process_s_fires_left_running_are_taken_over_after_a_restart(
    store: Store,
) -> None:
    fire = await store.claim_job_fire("report", 1000.0)
    assert fire is not None
    [claimed] = await store.job_runs("report")
    assert await store.take_over_fires(None, claimed_before=claimed["started_at"]) == []
    [taken] = await store.take_over_fires(None, claimed_before=claimed["started_at"] + 1)
    assert (taken["id"], taken["worker"]) == (fire, None)
