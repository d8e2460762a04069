"""The audit log on every backend (core/store/audit_rows.py): appended in order with a
hash chain, read back whole, and `verify` names the first row changed or removed; and a
queued run's sender (core/store/sender_tables.py), which roles are decided from.

Tampering is done with SQL through the store's raw `write` (the triggers that keep the
log and its head append-only are dropped first, as someone with the database's owner
rights can); with them in place, the same SQL is refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.audit import AuditLog, read_rows, verify
from core.errors import StoreError
from core.store import Store
from core.store.audit_rows import chain_hash
from tests.store.conftest import Reopen

_DROP_TRIGGERS = {
    "sqlite": [
        "DROP TRIGGER audit_log_no_update",
        "DROP TRIGGER audit_log_no_delete",
        "DROP TRIGGER audit_head_no_delete",
        "DROP TRIGGER audit_head_no_insert",
        "DROP TRIGGER audit_head_follows_the_log",
    ],
    "postgres": [
        "DROP TRIGGER audit_log_append_only ON audit_log",
        "DROP TRIGGER audit_log_no_truncate ON audit_log",
        "DROP TRIGGER audit_head_follows_the_log ON audit_head",
        "DROP TRIGGER audit_head_no_truncate ON audit_head",
    ],
}


def _backend(store: Store) -> str:
    return "sqlite" if type(store).__name__.startswith("Sqlite") else "postgres"


async def _tamper(store: Store, sql: str) -> None:
    for drop in _DROP_TRIGGERS[_backend(store)]:
        await store.write(drop)  # type: ignore[attr-defined]
    await store.write(sql)  # type: ignore[attr-defined]


async def _three(store: Store) -> AuditLog:
    audit = AuditLog(store)
    await audit.append("approval.asked", "slack:U1", {"tool": "bash", "call": "rm -rf x"}, conv="c")
    await audit.append("approval.denied", "slack:U2", {"tool": "bash"}, conv="c")
    await audit.append("command", "console", {"command": "/provider anthropic"})
    return audit


async def test_rows_are_numbered_and_chained_in_order(store: Store) -> None:
    before = time.time()
    await _three(store)
    rows = await read_rows(store)
    assert [r.seq for r in rows] == [1, 2, 3]
    assert [r.kind for r in rows] == ["approval.asked", "approval.denied", "command"]
    assert rows[0].detail == {"tool": "bash", "call": "rm -rf x"}
    assert (rows[0].actor, rows[0].conv, rows[0].prev) == ("slack:U1", "c", "")
    assert rows[1].prev == rows[0].hash
    assert rows[2].prev == rows[1].hash
    assert all(before <= r.at <= time.time() for r in rows)
    assert await store.audit_head() == (3, rows[2].hash)
    assert await verify(store) == (3, None)


async def test_an_empty_log_verifies(store: Store) -> None:
    assert await store.audit_head() == (0, "")
    assert await verify(store) == (0, None)


async def test_since_and_after_select_later_rows(store: Store) -> None:
    await _three(store)
    rows = await read_rows(store)
    assert [r.seq for r in await store.audit_rows(after=1)] == [2, 3]
    assert [r.seq for r in await store.audit_rows(since=rows[2].at)] == [3]
    assert [r.seq for r in await store.audit_rows(limit=2)] == [1, 2]


@pytest.mark.store_failures_expected
async def test_the_table_refuses_updates_and_deletes(store: Store) -> None:
    await _three(store)
    with pytest.raises(StoreError):
        await store.write("UPDATE audit_log SET actor = 'x' WHERE seq = 2")  # type: ignore[attr-defined]
    with pytest.raises(StoreError):
        await store.write("DELETE FROM audit_log WHERE seq = 2")  # type: ignore[attr-defined]
    assert await verify(store) == (3, None)


@pytest.mark.store_failures_expected
async def test_the_head_refuses_deletes_inserts_and_moves_but_an_append(store: Store) -> None:
    """The head is kept like the rows: it only ever moves to the row appended after it."""
    await _three(store)
    rows = await read_rows(store)
    write = store.write  # type: ignore[attr-defined]
    refused = [
        "DELETE FROM audit_head",
        "INSERT INTO audit_head (id, seq, hash) VALUES (2, 0, '')",
        f"UPDATE audit_head SET seq = 2, hash = '{rows[1].hash}'",  # back to row 2
        "UPDATE audit_head SET seq = 4, hash = 'f00'",  # to a row never appended
        f"UPDATE audit_head SET seq = 3, hash = '{rows[2].hash}'",  # in place
    ]
    if _backend(store) == "postgres":  # row triggers do not fire on TRUNCATE
        refused += ["TRUNCATE audit_log", "TRUNCATE audit_head", "TRUNCATE audit_log, audit_head"]
    for sql in refused:
        with pytest.raises(StoreError):
            await write(sql)
    assert await verify(store) == (3, None)
    await AuditLog(store).append("command", "console", {"command": "/clear"})
    assert await verify(store) == (4, None)


async def test_verify_names_an_edited_row(store: Store) -> None:
    await _three(store)
    await _tamper(store, 'UPDATE audit_log SET detail = \'{"tool":"ls"}\' WHERE seq = 2')
    count, problem = await verify(store)
    assert count == 3
    assert problem is not None
    assert (problem.seq, problem.what) == (2, "changed")


async def test_verify_names_a_deleted_row(store: Store) -> None:
    await _three(store)
    await _tamper(store, "DELETE FROM audit_log WHERE seq = 2")
    _, problem = await verify(store)
    assert problem is not None
    assert (problem.seq, problem.what) == (2, "removed")


async def test_verify_names_a_deleted_last_row(store: Store) -> None:
    await _three(store)
    await _tamper(store, "DELETE FROM audit_log WHERE seq = 3")
    _, problem = await verify(store)
    assert problem is not None
    assert (problem.seq, problem.what) == (3, "removed")


async def test_verify_fails_when_the_last_row_and_the_head_are_deleted(store: Store) -> None:
    await _three(store)
    await _tamper(store, "DELETE FROM audit_log WHERE seq = 3")
    await store.write("DELETE FROM audit_head")  # type: ignore[attr-defined]
    assert await store.audit_head() is None
    count, problem = await verify(store)
    assert count == 2
    assert problem is not None
    assert (problem.seq, problem.what) == (3, "removed")
    assert "the head row was removed" in problem.text


async def test_verify_fails_when_every_row_and_the_head_are_deleted(store: Store) -> None:
    await _three(store)
    await _tamper(store, "DELETE FROM audit_log")
    await store.write("DELETE FROM audit_head")  # type: ignore[attr-defined]
    count, problem = await verify(store)
    assert count == 0
    assert problem is not None
    assert (problem.seq, problem.what) == (1, "removed")


async def test_verify_names_a_row_added_past_the_head(store: Store) -> None:
    """A row inserted with a correct hash but without moving the head (as an append
    would, in the same transaction) shows."""
    await _three(store)
    last = (await read_rows(store))[-1]
    digest = chain_hash(last.hash, 4, 1.0, "command", "console", "", "{}")
    await store.write(  # type: ignore[attr-defined]
        "INSERT INTO audit_log (seq, at, kind, actor, conv, detail, prev, hash) "
        f"VALUES (4, 1.0, 'command', 'console', '', '{{}}', '{last.hash}', '{digest}')"
    )
    _, problem = await verify(store)
    assert problem is not None
    assert (problem.seq, problem.what) == (4, "added")


async def test_a_log_cut_back_with_its_head_fails_only_against_an_anchor(store: Store) -> None:
    """The edge the store cannot see alone (docs/governance.md#the-audit-log): someone
    who drops the triggers, deletes the last rows and moves the head back leaves a whole,
    shorter chain. The head printed by an earlier verify, kept elsewhere, shows it."""
    await _three(store)
    rows = await read_rows(store)
    anchor = (3, rows[2].hash[:16])
    assert await verify(store, anchor) == (3, None)
    await _tamper(store, "DELETE FROM audit_log WHERE seq = 3")
    await store.write(  # type: ignore[attr-defined]
        f"UPDATE audit_head SET seq = 2, hash = '{rows[1].hash}'"
    )
    assert await verify(store) == (2, None)
    _, problem = await verify(store, anchor)
    assert problem is not None
    assert (problem.seq, problem.what) == (3, "removed")
    assert (await verify(store, (2, rows[1].hash[:16])))[1] is None
    _, problem = await verify(store, (2, rows[2].hash[:16]))
    assert problem is not None
    assert (problem.seq, problem.what) == (2, "changed")


async def test_a_rehashed_row_still_breaks_the_next_link(store: Store) -> None:
    """An edit that also fixes its own row's hash is caught at the next row."""
    await _three(store)
    await _tamper(store, "UPDATE audit_log SET hash = 'f00' WHERE seq = 1")
    _, problem = await verify(store)
    assert problem is not None
    assert problem.seq == 1


async def test_concurrent_appends_from_two_stores_keep_one_chain(reopen: Reopen) -> None:
    """Two stores on one database (two workers) appending at once: no number twice, no
    fork in the chain."""
    first, second = await reopen(), await reopen()
    try:
        logs = [AuditLog(first), AuditLog(second)]
        await asyncio.gather(
            *(logs[i % 2].append("tool.refused", f"w{i % 2}", {"i": i}) for i in range(40))
        )
        count, problem = await verify(first)
        assert (count, problem) == (40, None)
        rows = await read_rows(second)
        assert sorted(r.detail["i"] for r in rows) == list(range(40))
    finally:
        await first.aclose()
        await second.aclose()


async def test_record_appends_in_the_background(store: Store) -> None:
    audit = AuditLog(store)
    audit.record("config.reloaded", "parley", {"changed": ["tools.yaml"]})
    await audit.flush()
    rows = await read_rows(store)
    assert [(r.kind, r.detail) for r in rows] == [("config.reloaded", {"changed": ["tools.yaml"]})]


async def test_a_runs_sender_is_kept_for_the_worker_that_claims_it(store: Store) -> None:
    store.add_sender("r1", "U1", "alice", ["S1", "S2"])
    store.add_sender("r2", "U2", "bob", [])
    await store.flush()
    assert await store.sender("r1") == ("U1", "alice", ("S1", "S2"))
    assert await store.sender("r2") == ("U2", "bob", ())
    assert await store.sender("r3") is None
