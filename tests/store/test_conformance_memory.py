"""What every `Store` backend promises about long-term memory (`MemoryStore`,
docs/delegation-memory.md),
through the protocol only: scoped reads and deletes, lexical recall, ids never reused."""

from __future__ import annotations

import time

from core.store import Scope, Store
from tests.store.conftest import Reopen
from tests.store.samples import CONV, OTHER

ALICE = Scope("user", "test:alice")
BOB = Scope("user", "test:bob")
HERE = Scope("conversation", CONV)
THERE = Scope("conversation", OTHER)
TEAM = Scope("team", "test")


async def test_a_memory_round_trips_with_its_scope_and_origin(store: Store) -> None:
    before = time.time()
    row = await store.remember(ALICE, "Alice prefers métric units ☕", made_by="alice", conv=CONV)
    assert (row.scope, row.text, row.made_by, row.conv) == (
        ALICE,
        "Alice prefers métric units ☕",
        "alice",
        CONV,
    )
    assert before <= row.created_at <= time.time()
    assert await store.memories([ALICE]) == [row]


async def test_recall_finds_by_stemmed_words_most_relevant_first(store: Store) -> None:
    await store.remember(HERE, "the deploy runs on Fridays", made_by="u", conv=CONV)
    best = await store.remember(
        HERE, "deploying needs the staging key; deploys are slow", made_by="u", conv=CONV
    )
    await store.remember(HERE, "lunch is at noon", made_by="u", conv=CONV)
    hits = await store.recall("how do I deploy to staging?", [HERE])
    assert [h.id for h in hits][:1] == [best.id]
    assert len(hits) == 2  # "lunch" shares no word with the question
    assert all(0 < h.score < 1 for h in hits)
    assert hits[0].score >= hits[1].score


async def test_recall_never_returns_a_memory_of_a_scope_not_asked_for(store: Store) -> None:
    await store.remember(ALICE, "the wifi password is hunter2", made_by="alice", conv=CONV)
    await store.remember(THERE, "the wifi password changed", made_by="bob", conv=OTHER)
    shared = await store.remember(TEAM, "the wifi is called parley-guest", made_by="b", conv=OTHER)
    assert [h.id for h in await store.recall("wifi password", [BOB, HERE, TEAM])] == [shared.id]
    assert await store.recall("wifi password", []) == []
    assert await store.memories([]) == []


async def test_a_query_of_stop_words_or_punctuation_finds_nothing(store: Store) -> None:
    await store.remember(HERE, "what it is, is what it was", made_by="u", conv=CONV)
    assert await store.recall("what is it?", [HERE]) == []
    assert await store.recall('"*) OR NEAR(', [HERE]) == []  # no query syntax gets through
    assert await store.recall("", [HERE]) == []


async def test_recall_takes_at_most_limit(store: Store) -> None:
    for i in range(7):
        await store.remember(HERE, f"release note {i}", made_by="u", conv=CONV)
    assert len(await store.recall("release", [HERE], limit=3)) == 3
    assert len(await store.recall("release", [HERE])) == 5


async def test_listing_is_newest_first_and_limited(store: Store) -> None:
    made = [await store.remember(HERE, f"note {i}", made_by="u", conv=CONV) for i in range(4)]
    await store.remember(THERE, "elsewhere", made_by="u", conv=OTHER)
    assert [m.id for m in await store.memories([HERE], limit=3)] == [m.id for m in made[::-1]][:3]


async def test_forgetting_one_needs_its_scope(store: Store) -> None:
    mine = await store.remember(ALICE, "alice's secret", made_by="alice", conv=CONV)
    assert not await store.forget_memory(mine.id, [BOB, HERE])
    assert await store.memories([ALICE]) == [mine]
    assert await store.forget_memory(mine.id, [ALICE])
    assert await store.memories([ALICE]) == []
    assert await store.recall("secret", [ALICE]) == []  # gone from the index too
    assert not await store.forget_memory(mine.id, [ALICE])


async def test_forgetting_a_scope_leaves_the_others(store: Store) -> None:
    await store.remember(HERE, "one", made_by="u", conv=CONV)
    await store.remember(HERE, "two", made_by="u", conv=CONV)
    kept = await store.remember(THERE, "three", made_by="u", conv=OTHER)
    assert await store.forget_memories(HERE) == 2
    assert await store.memories([HERE, THERE]) == [kept]
    assert await store.forget_memories(HERE) == 0


async def test_ids_are_never_reused_and_memories_outlive_a_reopen(reopen: Reopen) -> None:
    store = await reopen()
    try:
        first = await store.remember(HERE, "budget approved", made_by="u", conv=CONV)
        second = await store.remember(HERE, "budget is 10k", made_by="u", conv=CONV)
        assert await store.forget_memory(second.id, [HERE])
    finally:
        await store.aclose()
    store = await reopen()
    try:
        third = await store.remember(HERE, "budget frozen", made_by="u", conv=CONV)
        assert third.id > second.id > first.id
        assert {h.id for h in await store.recall("budget", [HERE])} == {first.id, third.id}
    finally:
        await store.aclose()
