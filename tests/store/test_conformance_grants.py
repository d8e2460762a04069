"""Durable approvals on every backend (core/store/protocol.py `GrantStore`): a grant is
found by its conversation or channel key, granted once per (key, tool), survives a
restart, and is revoked only through a key it belongs to."""

from __future__ import annotations

from core.store import GrantRow, Store
from tests.store.conftest import Reopen

CONV_KEY, CHANNEL_KEY, ELSEWHERE = "slack:C1:1700.1", "slack:C1", "slack:C2"


def grant(grant_id: str, key: str, tool: str, at: float = 1.0) -> GrantRow:
    scope = "channel" if key.count(":") == 1 else "conversation"
    return GrantRow(grant_id, scope, key, tool, "alice", at)


async def test_grants_are_found_by_key_and_kept_once(reopen: Reopen) -> None:
    store = await reopen()
    store.add_grant(grant("g1", CONV_KEY, "mcp__notes__delete_note", 1.0))
    store.add_grant(grant("g2", CHANNEL_KEY, "deploy", 2.0))
    store.add_grant(grant("g3", ELSEWHERE, "deploy", 3.0))
    store.add_grant(grant("g4", CONV_KEY, "mcp__notes__delete_note", 4.0))  # again: kept once
    await store.aclose()
    store = await reopen()  # a restart keeps them
    found = await store.grants([CONV_KEY, CHANNEL_KEY])
    assert [(g.id, g.scope, g.key, g.tool, g.granted_by) for g in found] == [
        ("g1", "conversation", CONV_KEY, "mcp__notes__delete_note", "alice"),
        ("g2", "channel", CHANNEL_KEY, "deploy", "alice"),
    ]
    assert await store.grants([]) == []
    await store.aclose()


async def test_a_grant_is_revoked_only_through_its_own_key(store: Store) -> None:
    store.add_grant(grant("g1", ELSEWHERE, "deploy"))
    store.add_grant(grant("g2", CHANNEL_KEY, "deploy"))
    await store.flush()
    assert await store.revoke_grant("g1", [CONV_KEY, CHANNEL_KEY]) is None  # not ours
    revoked = await store.revoke_grant("g2", [CONV_KEY, CHANNEL_KEY])
    assert revoked is not None
    assert revoked.tool == "deploy"
    assert await store.grants([CHANNEL_KEY]) == []
    assert [g.id for g in await store.grants([ELSEWHERE])] == ["g1"]
