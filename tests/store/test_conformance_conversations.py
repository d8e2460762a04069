"""What every `Store` backend promises about conversations (see test_conformance.py):
histories and snapshots, `/clear`, the journal, provider preferences and goals, event
dedupe, approvals and events. Through the protocol only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath

from core.chat import PromptRef
from core.messages import Message
from core.store import GoalRow, Store
from tests.store.samples import CONV, OTHER, approval, dumped, goal, history

# --- messages, snapshots, /clear ---------------------------------------------------------


async def test_messages_round_trip_in_order_with_unicode(store: Store) -> None:
    store.save_messages(CONV, history())
    await store.flush()
    assert dumped(await store.load_messages(CONV)) == dumped(history())
    assert await store.load_messages(OTHER) == []


async def test_saving_the_changed_positions_keeps_the_others(store: Store) -> None:
    messages = history()
    store.save_messages(CONV, messages)
    messages[1] = Message.user("edited")
    messages.append(Message.user("one more"))
    store.save_messages(CONV, messages, changed=[1, 5], shrunk=False)
    await store.flush()
    assert dumped(await store.load_messages(CONV)) == dumped(messages)


async def test_a_shrunk_history_drops_the_stored_tail(store: Store) -> None:
    store.save_messages(CONV, history())
    store.save_messages(CONV, history()[:2], changed=[])
    await store.flush()
    assert dumped(await store.load_messages(CONV)) == dumped(history()[:2])


async def test_a_history_that_did_not_shrink_keeps_the_stored_tail(store: Store) -> None:
    store.save_messages(CONV, history())
    store.save_messages(CONV, history()[:2], changed=[], shrunk=False)
    await store.flush()
    assert len(await store.load_messages(CONV)) == len(history())


async def test_the_last_snapshot_wins(store: Store) -> None:
    assert await store.conversation(CONV) is None
    store.save_snapshot(CONV, input_tokens=10, output_tokens=2, last_compaction=None)
    store.save_snapshot(CONV, input_tokens=300, output_tokens=40, last_compaction="résumé")
    await store.flush()
    row = await store.conversation(CONV)
    assert row is not None
    assert (row.key, row.input_tokens, row.output_tokens) == (CONV, 300, 40)
    assert row.last_compaction == "résumé"


async def test_clear_drops_history_totals_journal_and_goal(store: Store) -> None:
    store.save_messages(CONV, history())
    store.save_snapshot(CONV, input_tokens=10, output_tokens=2, last_compaction=None)
    store.save_journal(CONV, {"objective": "x"})
    await store.save_goal(goal(), CONV)
    await store.create_run("r1", CONV, "user")
    store.set_run_state("r1", "timed_out", "interrupted", resumable=True)
    await store.set_provider_pref("test", "c1", "fast")
    await store.clear_conversation(CONV)
    assert await store.load_messages(CONV) == []
    assert await store.conversation(CONV) is None
    assert await store.journal(CONV) is None
    assert await store.goal(CONV) is None
    run = await store.run("r1")
    assert run is not None
    assert (run.state, run.resumable) == ("timed_out", False)
    assert await store.provider_pref("test", "c1") == "fast"


async def test_clear_leaves_other_conversations_alone(store: Store) -> None:
    for conv in (CONV, OTHER):
        store.save_messages(conv, history())
        store.save_journal(conv, {"objective": conv})
    await store.clear_conversation(CONV)
    assert len(await store.load_messages(OTHER)) == len(history())
    assert await store.journal(OTHER) == {"objective": OTHER}


# --- journal, provider preferences, goals ------------------------------------------------


async def test_a_journal_round_trips_and_the_last_save_wins(store: Store) -> None:
    assert await store.journal(CONV) is None
    store.save_journal(CONV, {"objective": "first"})
    body = {"objective": "Bericht über Ärger", "decisions": ["a", "b"], "blockers": [], "n": 2}
    store.save_journal(CONV, body)
    await store.flush()
    assert await store.journal(CONV) == body


async def test_a_provider_preference_is_per_channel_and_the_last_choice_stands(
    store: Store,
) -> None:
    assert await store.provider_pref("slack", "C1") is None
    await store.set_provider_pref("slack", "C1", "fast")
    await store.set_provider_pref("slack", "C1", "smart")
    await store.set_provider_pref("discord", "C1", "local")
    assert await store.provider_pref("slack", "C1") == "smart"
    assert await store.provider_pref("discord", "C1") == "local"


async def test_a_goal_is_kept_under_the_conversation_it_is_saved_for(store: Store) -> None:
    assert await store.goal(CONV) is None
    await store.save_goal(goal(), CONV)
    await store.save_goal(goal("ship it twice", turns=4), CONV)
    assert await store.goal(CONV) == GoalRow(CONV, "ship it twice", "active", True, 10, 4, "a note")
    assert await store.goal(OTHER) is None


async def test_saving_no_goal_clears_it(store: Store) -> None:
    await store.save_goal(goal(), CONV)
    await store.save_goal(None, CONV)
    assert await store.goal(CONV) is None


# --- platform event dedupe ---------------------------------------------------------------


async def test_an_event_is_seen_once_marked(store: Store) -> None:
    assert not await store.seen("slack", "ev1")
    await store.mark_seen("slack", "ev1")
    assert await store.seen("slack", "ev1")
    assert not await store.seen("discord", "ev1")
    assert not await store.seen("slack", "ev2")


async def test_marking_an_event_seen_again_changes_nothing(store: Store) -> None:
    store.mark_seen_soon("slack", "ev1")
    store.mark_seen_soon("slack", "ev1")
    await store.flush()
    await store.mark_seen("slack", "ev1")
    assert await store.seen("slack", "ev1")


async def test_mark_seen_commits_what_was_queued_before(store: Store) -> None:
    store.save_journal(CONV, {"objective": "with the event"})
    await store.mark_seen("slack", "ev1")
    assert await store.journal(CONV) == {"objective": "with the event"}


# --- approvals ---------------------------------------------------------------------------


async def test_a_requested_approval_is_pending_without_prompt_or_answer(store: Store) -> None:
    await store.request_approval(approval("a1"))
    expected = replace(approval("a1"), state="pending")
    assert await store.approval("a1") == expected
    assert await store.approval("a2") is None


async def test_a_posted_prompt_is_remembered(store: Store) -> None:
    await store.request_approval(approval("a1"))
    store.approval_posted("a1", PromptRef("C1", "m42", "Allow `rm`? ✅/❌"))
    await store.flush()
    row = await store.approval("a1")
    assert row is not None
    assert row.prompt == PromptRef("C1", "m42", "Allow `rm`? ✅/❌")


async def test_the_first_answer_to_a_pending_request_stands(store: Store) -> None:
    await store.request_approval(approval("a1"))
    await store.answer_approval("a1", "approved", "ana")
    await store.answer_approval("a1", "denied", "bob")
    row = await store.approval("a1")
    assert row is not None
    assert (row.state, row.answer, row.answered_by) == ("pending", "approved", "ana")


async def test_a_decided_request_takes_no_answer(store: Store) -> None:
    await store.request_approval(approval("a1"))
    store.approval_resolved("a1", "denied")
    await store.flush()
    await store.answer_approval("a1", "approved", "ana")
    row = await store.approval("a1")
    assert row is not None
    assert (row.state, row.answer) == ("denied", None)


async def test_a_call_waits_on_its_latest_pending_request(store: Store) -> None:
    await store.request_approval(approval("a1", at=1.0))
    await store.request_approval(approval("a2", at=2.0))
    await store.request_approval(approval("a3", call_id="c2", at=3.0))
    found = await store.pending_approval("r1", "c1")
    assert found is not None
    assert found.id == "a2"
    store.approval_resolved("a2", "approved")
    await store.flush()
    found = await store.pending_approval("r1", "c1")
    assert found is not None
    assert found.id == "a1"
    assert await store.pending_approval("r2", "c1") is None


async def test_pending_approvals_are_the_older_pending_ones_oldest_first(store: Store) -> None:
    await store.request_approval(approval("late", at=30.0))
    await store.request_approval(approval("b", run_id="r2", at=20.0))
    await store.request_approval(approval("a", run_id="r3", at=10.0))
    await store.request_approval(approval("done", run_id="r4", at=5.0))
    store.approval_resolved("done", "approved")
    await store.flush()
    assert [r.id for r in await store.pending_approvals(before=25.0)] == ["a", "b"]


async def test_expiring_approvals_touches_only_pending_ones(store: Store) -> None:
    await store.request_approval(approval("a1", run_id="r1"))
    await store.request_approval(approval("a2", run_id="r2"))
    await store.request_approval(approval("a3", run_id="r3"))
    store.approval_resolved("a2", "approved")
    store.expire_approvals(iter(["a1", "a2"]))
    await store.flush()
    states = {}
    for approval_id in ("a1", "a2", "a3"):
        row = await store.approval(approval_id)
        assert row is not None
        states[approval_id] = row.state
    assert states == {"a1": "expired", "a2": "approved", "a3": "pending"}


# --- events ------------------------------------------------------------------------------


async def test_events_come_back_per_run_in_the_order_they_were_added(store: Store) -> None:
    store.add_event(
        "run_started", {"text": "grüß dich"}, run_id="r1", conv=CONV, iteration=None, at=5.0
    )
    store.add_event("llm_call", {"n": 1}, run_id="r1", conv=CONV, iteration=1, at=4.0)
    store.add_event("elsewhere", {}, run_id="r2", conv=OTHER, iteration=None, at=4.5)
    store.add_event(
        "tool", {"ok": True, "ids": [1, 2]}, run_id="r1", conv=CONV, iteration=1, at=4.0
    )
    await store.flush()
    assert await store.events("r1") == [
        (5.0, "run_started", None, {"text": "grüß dich"}),
        (4.0, "llm_call", 1, {"n": 1}),
        (4.0, "tool", 1, {"ok": True, "ids": [1, 2]}),
    ]
    assert await store.events("r3") == []


async def test_event_data_that_is_not_json_is_stored_as_text(store: Store) -> None:
    store.add_event(
        "odd", {"path": PurePosixPath("/tmp/x")}, run_id="r1", conv=None, iteration=None, at=1.0
    )
    await store.flush()
    assert await store.events("r1") == [(1.0, "odd", None, {"path": "/tmp/x"})]
