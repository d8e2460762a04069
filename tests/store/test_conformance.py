"""What every `Store` backend promises (core/store/protocol.py), tested through the
protocol only: no SQL, no private attributes. Queued (non-async) writes are flushed
before they are read; `async` writes are read as soon as they return.

This file: runs, checkpoints, the tool-call envelope, jobs, lifecycle and durability;
test_conformance_conversations.py: messages, journal, preferences, dedupe, approvals,
events."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.errors import StoreError
from core.store import Store
from tests.store.conftest import Reopen
from tests.store.samples import CONV, OTHER, checkpoint, dumped, history

# --- runs --------------------------------------------------------------------------------


async def test_a_created_run_is_running_and_started(store: Store) -> None:
    before = time.time()
    await store.create_run("r1", CONV, "user")
    run = await store.run("r1")
    assert run is not None
    assert (run.id, run.conv, run.state, run.trigger) == ("r1", CONV, "running", "user")
    assert run.started_at is not None
    assert before <= run.created_at <= run.started_at <= time.time()
    assert (run.ended_at, run.iterations, run.resumable) == (None, 0, False)


async def test_a_queued_run_keeps_its_text_and_starts_later(store: Store) -> None:
    await store.create_run("r1", CONV, "user", state="queued", text="héllo 👋")
    queued = await store.run("r1")
    assert queued is not None
    assert (queued.state, queued.text, queued.started_at) == ("queued", "héllo 👋", None)
    store.start_run("r1")
    await store.flush()
    started = await store.run("r1")
    assert started is not None
    assert started.state == "running"
    assert started.started_at is not None


async def test_a_child_run_names_its_parent_and_is_listed_under_it(store: Store) -> None:
    await store.create_run("p1", CONV, "user")
    await store.create_run("c2", f"{CONV}:child:c2", "child", parent_run_id="p1")
    await store.create_run("c1", f"{CONV}:child:c1", "child", parent_run_id="p1")
    await store.create_run("other", OTHER, "user")
    child = await store.run("c2")
    assert child is not None
    assert (child.parent_run_id, child.state, child.trigger) == ("p1", "running", "child")
    parent = await store.run("p1")
    assert parent is not None
    assert parent.parent_run_id is None
    assert [r.id for r in await store.child_runs("p1")] == ["c2", "c1"]  # oldest first
    assert await store.child_runs("c1") == []
    assert {r.id for r in await store.runs(limit=10)} == {"p1", "c1", "c2", "other"}
    # A child is created running in its parent's process: never a queued run to claim.
    assert await store.claim_queued_run("w1") is None


async def test_an_unknown_run_is_none(store: Store) -> None:
    assert await store.run("nope") is None
    assert await store.find_runs("nope") == []


async def test_finish_run_records_the_answer_and_what_it_used(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.finish_run(
        "r1",
        state="completed",
        reason="final answer",
        text="done ✓",
        iterations=3,
        input_tokens=120,
        output_tokens=45,
    )
    await store.flush()
    run = await store.run("r1")
    assert run is not None
    assert (run.state, run.reason, run.text) == ("completed", "final answer", "done ✓")
    assert (run.iterations, run.input_tokens, run.output_tokens) == (3, 120, 45)
    assert run.ended_at is not None


async def test_set_run_state_changes_resumable_only_when_given(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "timed_out", "interrupted", resumable=True)
    await store.flush()
    interrupted = await store.run("r1")
    assert interrupted is not None
    assert (interrupted.state, interrupted.reason, interrupted.resumable) == (
        "timed_out",
        "interrupted",
        True,
    )
    assert interrupted.ended_at is not None
    store.set_run_state("r1", "cancelled", "dropped by /stop")
    await store.flush()
    cancelled = await store.run("r1")
    assert cancelled is not None
    assert (cancelled.state, cancelled.resumable) == ("cancelled", True)


async def test_a_resumed_run_runs_again_and_is_no_longer_resumable(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "timed_out", "interrupted")
    store.mark_resumable("r1")
    await store.flush()
    marked = await store.run("r1")
    assert marked is not None
    assert marked.resumable
    store.resume_run("r1")
    await store.flush()
    resumed = await store.run("r1")
    assert resumed is not None
    assert (resumed.state, resumed.resumable, resumed.ended_at) == ("running", False, None)


async def test_new_input_supersedes_only_that_conversations_resumable_runs(store: Store) -> None:
    for run_id, conv in (("r1", CONV), ("r2", CONV), ("r3", OTHER)):
        await store.create_run(run_id, conv, "user")
        store.set_run_state(run_id, "timed_out", "interrupted", resumable=True)
    store.forget_resumable(CONV)
    await store.flush()
    resumable = {r.id: r.resumable for r in await store.runs(limit=10)}
    assert resumable == {"r1": False, "r2": False, "r3": True}


async def test_find_runs_matches_an_id_prefix_newest_first(store: Store) -> None:
    for run_id in ("abc1", "abc2", "abd3"):
        await store.create_run(run_id, CONV, "user")
    assert [r.id for r in await store.find_runs("abc")] == ["abc2", "abc1"]
    assert [r.id for r in await store.find_runs("abd3")] == ["abd3"]
    assert len(await store.find_runs("")) == 3


async def test_runs_filter_by_conversation_and_state_newest_first(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    await store.create_run("r2", OTHER, "schedule")
    await store.create_run("r3", CONV, "user", state="queued")
    await store.create_run("r4", CONV, "user")
    assert [r.id for r in await store.runs()] == ["r4", "r3", "r2", "r1"]
    assert [r.id for r in await store.runs(conv=CONV)] == ["r4", "r3", "r1"]
    assert [r.id for r in await store.runs(states=["queued"])] == ["r3"]
    assert [r.id for r in await store.runs(conv=CONV, states=["running"])] == ["r4", "r1"]
    assert [r.id for r in await store.runs(limit=2)] == ["r4", "r3"]


@pytest.mark.store_failures_expected
async def test_a_run_id_is_created_once(store: Store) -> None:
    await store.create_run("r1", CONV, "user", text="first")
    with pytest.raises(StoreError):
        await store.create_run("r1", OTHER, "user", text="second")
    run = await store.run("r1")
    assert run is not None
    assert (run.conv, run.text) == (CONV, "first")


# --- checkpoints -------------------------------------------------------------------------


async def test_the_last_checkpoint_is_the_one_with_the_highest_seq(store: Store) -> None:
    for seq in (2, 3, 1):
        store.checkpoint(checkpoint("r1", seq))
    store.checkpoint(checkpoint("r2", 9))
    await store.flush()
    assert await store.last_checkpoint("r1") == checkpoint("r1", 3)


async def test_a_checkpoint_with_the_same_seq_replaces_the_earlier(store: Store) -> None:
    store.checkpoint(checkpoint("r1", 1, "input"))
    store.checkpoint(checkpoint("r1", 1, "final"))
    await store.flush()
    last = await store.last_checkpoint("r1")
    assert last is not None
    assert last.kind == "final"
    assert last.completed == ("call_1",)


async def test_a_run_without_checkpoints_has_none(store: Store) -> None:
    assert await store.last_checkpoint("r1") is None


# --- the tool-call envelope and the process-group ledger ----------------------------------


async def test_a_started_tool_call_is_not_completed(store: Store) -> None:
    before = time.time()
    store.tool_started("r1", "call_0", "write_file", '{"path": "ä.txt"}', False)
    await store.flush()
    row = (await store.tool_calls("r1"))["call_0"]
    assert (row.name, row.arguments, row.idempotent) == ("write_file", '{"path": "ä.txt"}', False)
    assert before <= row.started_at
    assert not row.completed
    assert row.result is None


async def test_a_completed_tool_call_keeps_its_result(store: Store) -> None:
    store.tool_started("r1", "call_0", "list_directory", "{}", True)
    store.tool_started("r1", "call_1", "read_file", "{}", True)
    store.tool_completed("r1", "call_0", "a.txt b.txt", False)
    store.tool_completed("r1", "call_1", "no such file", True)
    await store.flush()
    calls = await store.tool_calls("r1")
    assert calls["call_0"].completed
    assert (calls["call_0"].result, calls["call_0"].is_error) == ("a.txt b.txt", False)
    assert (calls["call_1"].result, calls["call_1"].is_error) == ("no such file", True)


async def test_tool_calls_are_kept_per_run(store: Store) -> None:
    store.tool_started("r1", "call_0", "list_directory", "{}", True)
    store.tool_started("r2", "call_0", "bash", "{}", False)
    await store.flush()
    assert (await store.tool_calls("r1"))["call_0"].name == "list_directory"
    assert (await store.tool_calls("r2"))["call_0"].name == "bash"
    assert await store.tool_calls("r3") == {}


async def test_a_call_started_again_is_open_again(store: Store) -> None:
    store.tool_started("r1", "call_0", "list_directory", "{}", True)
    store.tool_completed("r1", "call_0", "a.txt", False)
    store.tool_started("r1", "call_0", "write_file", '{"path": "x"}', False)
    await store.flush()
    row = (await store.tool_calls("r1"))["call_0"]
    assert (row.name, row.completed, row.result) == ("write_file", False, None)


async def test_live_tool_groups_are_taken_once(store: Store) -> None:
    store.tool_group_started(101, 5000, "boot-a")
    store.tool_group_started(102, 6000, "boot-a")
    store.tool_group_ended(101)
    await store.flush()
    assert await store.take_tool_groups() == [(102, 6000, "boot-a")]
    assert await store.take_tool_groups() == []


# --- scheduled jobs ----------------------------------------------------------------------


async def test_a_fire_is_claimed_once(store: Store) -> None:
    first = await store.claim_job_fire("report", 1000.0)
    assert first is not None
    assert await store.claim_job_fire("report", 1000.0) is None
    assert await store.claim_job_fire("report", 2000.0) not in (None, first)
    assert await store.claim_job_fire("other", 1000.0) is not None


async def test_concurrent_claims_of_one_fire_have_one_winner(store: Store) -> None:
    claims = await asyncio.gather(*(store.claim_job_fire("report", 1000.0) for _ in range(8)))
    assert len([c for c in claims if c is not None]) == 1


async def test_two_stores_on_the_same_data_claim_each_fire_once(reopen: Reopen) -> None:
    first, second = await reopen(), await reopen()
    try:
        fires = [1000.0 + n for n in range(10)]
        claims = await asyncio.gather(
            *(s.claim_job_fire("report", f) for f in fires for s in (first, second, first))
        )
        for n in range(len(fires)):
            assert len([c for c in claims[3 * n : 3 * n + 3] if c is not None]) == 1
        assert len(await second.job_runs("report", limit=100)) == len(fires)
    finally:
        await first.aclose()
        await second.aclose()


async def test_the_last_fire_is_the_latest_claimed(store: Store) -> None:
    assert await store.job_last_fire("report") is None
    await store.claim_job_fire("report", 2000.0)
    await store.claim_job_fire("report", 1000.0)
    assert await store.job_last_fire("report") == 2000.0


async def test_a_claimed_fire_is_running_until_finished(store: Store) -> None:
    before = time.time()
    job_run = await store.claim_job_fire("report", 1000.0)
    assert job_run is not None
    [row] = await store.job_runs("report")
    assert (row["id"], row["fire_time"], row["state"], row["ended_at"]) == (
        job_run,
        1000.0,
        "running",
        None,
    )
    assert before <= row["started_at"]
    await store.finish_job_run(
        job_run, state="completed", run_id="r1", result="all green ✓", delivered=True, error=None
    )
    [row] = await store.job_runs("report")
    assert (row["state"], row["run_id"], row["result"]) == ("completed", "r1", "all green ✓")
    assert (row["delivered"], row["error"]) == (True, None)
    assert row["ended_at"] is not None


async def test_job_runs_are_latest_fire_first_within_the_limit(store: Store) -> None:
    for fire in (1000.0, 3000.0, 2000.0):
        await store.claim_job_fire("report", fire)
    await store.claim_job_fire("other", 9000.0)
    assert [r["fire_time"] for r in await store.job_runs("report", limit=10)] == [
        3000.0,
        2000.0,
        1000.0,
    ]
    assert [r["fire_time"] for r in await store.job_runs("report")] == [3000.0]
    assert await store.job_runs("fresh") == []


# --- lifecycle and durability ------------------------------------------------------------


async def test_an_async_write_is_read_as_soon_as_it_returns(store: Store) -> None:
    await store.set_provider_pref("slack", "C1", "fast")
    assert await store.provider_pref("slack", "C1") == "fast"


async def test_a_chats_instruction_choice_is_kept_per_chat_and_can_be_forgotten(
    store: Store,
) -> None:
    assert await store.instruction_pref("slack", "C1") is None
    await store.set_instruction_pref("slack", "C1", "ops")
    await store.set_instruction_pref("slack", "C1", "oncall")  # the last choice stands
    await store.set_instruction_pref("slack", "C2", "ops")
    assert await store.instruction_pref("slack", "C1") == "oncall"
    await store.set_instruction_pref("slack", "C1", None)
    assert await store.instruction_pref("slack", "C1") is None
    assert await store.instruction_pref("slack", "C2") == "ops"


async def test_an_async_write_also_commits_what_was_queued_before_it(store: Store) -> None:
    store.save_journal(CONV, {"objective": "queued first"})
    store.checkpoint(checkpoint("r1", 1))
    await store.create_run("r1", CONV, "user")
    assert await store.journal(CONV) == {"objective": "queued first"}
    assert await store.last_checkpoint("r1") == checkpoint("r1", 1)


async def test_a_flush_with_nothing_queued_returns(store: Store) -> None:
    await store.flush()
    await store.flush()


async def test_flushed_writes_survive_close_and_reopen(reopen: Reopen) -> None:
    first = await reopen()
    await first.create_run("r1", CONV, "user")
    store_everything_queued(first)
    await first.flush()
    await first.aclose()
    again = await reopen()
    try:
        await assert_everything_queued_is_there(again)
    finally:
        await again.aclose()


async def test_closing_commits_what_is_queued(reopen: Reopen) -> None:
    first = await reopen()
    await first.create_run("r1", CONV, "user")
    store_everything_queued(first)
    await first.aclose()
    again = await reopen()
    try:
        await assert_everything_queued_is_there(again)
    finally:
        await again.aclose()


async def test_leaving_an_async_with_block_closes_the_store(reopen: Reopen) -> None:
    async with await reopen() as first:
        store_everything_queued(first)
    async with await reopen() as again:
        assert await again.journal(CONV) == {"objective": "kept"}


async def test_stores_opened_at_once_on_new_data_all_work(reopen: Reopen) -> None:
    stores = await asyncio.gather(*(reopen() for _ in range(3)))
    try:
        await stores[0].set_provider_pref("slack", "C1", "fast")
        for other in stores[1:]:
            assert await other.provider_pref("slack", "C1") == "fast"
    finally:
        for opened in stores:
            await opened.aclose()


async def test_text_with_a_nul_character_is_stored(store: Store) -> None:
    await store.create_run("r1", CONV, "user")
    store.tool_started("r1", "call_0", "read_file", '{"path": "a.bin"}', True)
    store.tool_completed("r1", "call_0", "ELF\x00\x01 binary", False)
    store.finish_run(
        "r1", state="completed", reason="", text="a\x00b", iterations=1, input_tokens=1,
        output_tokens=1,
    )  # fmt: skip
    await store.flush()
    result = (await store.tool_calls("r1"))["call_0"].result
    assert result in ("ELF\x00\x01 binary", "ELF\ufffd\x01 binary")
    run = await store.run("r1")
    assert run is not None
    assert run.text in ("a\x00b", "a\ufffdb")


async def test_write_owners_do_not_change_what_is_written(store: Store) -> None:
    async def conversation(conv: str) -> None:
        Store.write_for(conv)
        store.save_journal(conv, {"objective": conv})
        await store.flush()

    await asyncio.gather(conversation(CONV), conversation(OTHER))
    assert await store.journal(CONV) == {"objective": CONV}
    assert await store.journal(OTHER) == {"objective": OTHER}


def store_everything_queued(store: Store) -> None:
    """One queued write of each kind that a restart must find."""
    store.save_messages(CONV, history())
    store.save_snapshot(CONV, input_tokens=7, output_tokens=3, last_compaction=None)
    store.save_journal(CONV, {"objective": "kept"})
    store.checkpoint(checkpoint("r1", 1))
    store.tool_started("r1", "call_0", "bash", "{}", False)
    store.finish_run(
        "r1", state="completed", reason="", text="ok", iterations=1, input_tokens=7, output_tokens=3
    )
    store.mark_seen_soon("slack", "ev1")
    store.add_event("run_finished", {}, run_id="r1", conv=CONV, iteration=None, at=1.0)


async def assert_everything_queued_is_there(store: Store) -> None:
    assert dumped(await store.load_messages(CONV)) == dumped(history())
    snapshot = await store.conversation(CONV)
    assert snapshot is not None
    assert snapshot.input_tokens == 7
    assert await store.journal(CONV) == {"objective": "kept"}
    assert await store.last_checkpoint("r1") == checkpoint("r1", 1)
    assert "call_0" in await store.tool_calls("r1")
    run = await store.run("r1")
    assert run is not None
    assert (run.state, run.text) == ("completed", "ok")
    assert await store.seen("slack", "ev1")
    assert [e[1] for e in await store.events("r1")] == ["run_finished"]
