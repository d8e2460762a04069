"""What only the PostgreSQL store has to show (the conformance suite holds it to the rest):
its group commit's failure isolation, driven by a trigger that refuses some rows as
tests/agent/test_store_failures.py does for SQLite; migrations under concurrent opens;
the same tables and columns as SQLite; a lost connection costs nothing after it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from core.errors import StoreError
from core.store import Store, open_store
from core.store.migrations import SCHEMA_VERSION
from tests.store.conftest import postgres_schema

if TYPE_CHECKING:  # imported by the tests: psycopg may be missing, and then they skip
    from core.store.postgres import PostgresStore

REFUSE_BAD = """
CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.conv LIKE '%bad%' THEN RAISE EXCEPTION 'the disk refuses this row'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_bad BEFORE INSERT OR UPDATE ON journals
    FOR EACH ROW EXECUTE FUNCTION refuse_bad();
"""


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with postgres_schema() as schema_url:
        yield schema_url


@pytest.fixture
async def pg(url: str) -> AsyncIterator[PostgresStore]:
    from core.store.postgres import PostgresStore

    store = await PostgresStore.open(url)
    try:
        yield store
    finally:
        await store.aclose()


async def sql(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run `statement` on a connection of its own (in the test's schema)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []


# --- failure isolation ---------------------------------------------------------------


@pytest.mark.store_failures_expected
async def test_a_bad_statement_fails_alone_and_its_writer_hears_it(
    url: str, pg: PostgresStore
) -> None:
    await sql(url, REFUSE_BAD)
    pg.save_journal("good-1", {"a": 1})
    bad = asyncio.ensure_future(
        pg.write("INSERT INTO journals (conv, body, updated_at) VALUES ('bad', '{}', 0)")
    )
    pg.save_journal("good-2", {"b": 2})
    with pytest.raises(StoreError, match="refuses"):
        await bad
    await pg.flush()  # the waiter was told; nothing else failed
    assert await pg.journal("good-1") == {"a": 1}
    assert await pg.journal("good-2") == {"b": 2}


@pytest.mark.store_failures_expected
async def test_flush_raises_for_a_failed_queued_write_once(url: str, pg: PostgresStore) -> None:
    await sql(url, REFUSE_BAD)
    pg.save_journal("bad", {"x": 1})
    pg.save_journal("fine", {"y": 2})
    with pytest.raises(StoreError, match="refuses"):
        await pg.flush()
    await pg.flush()  # reported once
    assert await pg.journal("fine") == {"y": 2}
    assert await pg.journal("bad") is None


@pytest.mark.store_failures_expected
async def test_a_failed_write_is_raised_by_its_owners_flush_only(
    url: str, pg: PostgresStore
) -> None:
    await sql(url, REFUSE_BAD)
    started = asyncio.Event()

    async def conversation(conv: str) -> None:
        Store.write_for(conv)
        pg.save_journal(conv, {"objective": conv})
        started.set()
        await pg.flush()

    good = asyncio.create_task(conversation("good"))
    await started.wait()
    with pytest.raises(StoreError, match="refuses"):
        await conversation("bad")
    await good  # the same batch, another owner: no error
    assert await pg.journal("good") == {"objective": "good"}


# --- migrations and schema -----------------------------------------------------------


async def test_opens_at_once_apply_each_migration_once(url: str) -> None:
    from core.store.postgres import PostgresStore

    stores = await asyncio.gather(*(PostgresStore.open(url) for _ in range(4)))
    for store in stores:
        await store.aclose()
    versions = await sql(url, "SELECT version FROM schema_version ORDER BY version")
    assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))


async def test_a_schema_from_a_newer_parley_is_refused(url: str) -> None:
    async with await open_store(url):
        pass
    await sql(url, "INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(RuntimeError, match="newer Parley"):
        await open_store(url)


async def test_the_tables_and_columns_are_sqlites(url: str, tmp_path: Path) -> None:
    async with await open_store(url):
        pass
    rows = await sql(
        url,
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema()",
    )
    postgres: dict[str, set[str]] = {}
    for table, column in rows:
        postgres.setdefault(table, set()).add(column)
    async with await open_store(tmp_path / "parley.db"):
        pass
    with sqlite3.connect(tmp_path / "parley.db") as lite:
        tables = [r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        sqlite = {
            t: {r[1] for r in lite.execute(f"PRAGMA table_info({t})")}
            for t in tables
            if not t.startswith("sqlite_")
        }
    lite.close()
    # The full-text index of memories is each backend's own: FTS5 tables in SQLite, a
    # generated tsvector column in PostgreSQL.
    assert postgres["memories"] - sqlite["memories"] == {"tsv"}
    postgres["memories"].discard("tsv")
    assert {t for t in sqlite if t.startswith("memories_fts")} >= {"memories_fts"}
    sqlite = {t: columns for t, columns in sqlite.items() if not t.startswith("memories_fts")}
    assert postgres == sqlite


# --- several workers --------------------------------------------------------------------


async def test_queued_runs_keep_the_order_they_were_stored_in_whatever_the_clocks(
    url: str,
) -> None:
    async with await open_store(url) as fast, await open_store(url) as slow:
        fast.set_worker("fast:1:a")
        slow.set_worker("slow:1:b")
        await fast.create_run("r1", "test:c1:", "user", state="queued", text="1", shared=True)
        await slow.create_run("r2", "test:c1:", "user", state="queued", text="2", shared=True)
        await fast.create_run("r3", "test:c1:", "user", state="queued", text="3", shared=True)
        # what the workers' clocks wrote: `fast` an hour ahead of `slow`
        await sql(url, "UPDATE runs SET created_at = created_at + 3600 WHERE id <> 'r2'")
        claimed = []
        for _ in range(3):
            run = await slow.claim_queued_run("slow:1:b")
            assert run is not None
            claimed.append(run.id)
            slow.set_run_state(run.id, "completed", "")
        assert claimed == ["r1", "r2", "r3"]
        assert [r.id for r in await fast.runs(conv="test:c1:")] == ["r3", "r2", "r1"]
        await fast.create_run("r4", "test:c1:", "user", state="queued", shared=True)
        await slow.create_run("r5", "test:c1:", "user", state="queued", shared=True)
        await sql(url, "UPDATE runs SET created_at = created_at - 3600 WHERE id = 'r5'")
        assert await fast.cancel_queued("test:c1:", "dropped") == ["r4", "r5"]


async def test_a_claim_whose_caller_gave_up_ends_before_the_store_closes(url: str) -> None:
    """A claim outlives its cancelled caller (it must not stop mid-transaction); closing
    the store waits for it, instead of closing the pool under it (the statement then ran,
    or failed, after the store was gone: seen as a worker test's teardown failing)."""
    import psycopg

    store = await open_store(url)
    store.set_worker("w:1:a")
    await store.create_run("r1", "test:c1:", "user", state="queued", text="1", shared=True)
    async with await psycopg.AsyncConnection.connect(url) as blocker:
        await blocker.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")  # held until commit
        claim = asyncio.ensure_future(store.claim_queued_run("w:1:a"))
        schema = url.rsplit("application_name=", 1)[1]
        waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        waiting += "WHERE NOT l.granted AND a.application_name = %s"
        async with asyncio.timeout(10):
            while (await sql(url, waiting, (schema,)))[0][0] == 0:
                await asyncio.sleep(0.01)  # the claim waits for the lock, inside its transaction
        claim.cancel()
        closing = asyncio.ensure_future(store.aclose())
        await asyncio.sleep(0.3)
        assert not closing.done(), "the store closed while its claim was still running"
        await blocker.commit()
    await asyncio.wait_for(closing, 10)
    [(state, worker)] = await sql(url, "SELECT state, worker FROM runs WHERE id = 'r1'")
    assert (state, worker) == ("running", "w:1:a")  # it ended: claimed, as it began to


# --- connections -----------------------------------------------------------------------


async def test_the_store_goes_on_after_the_server_drops_its_connections(
    url: str, pg: PostgresStore
) -> None:
    await pg.set_provider_pref("slack", "C1", "fast")
    schema = url.rsplit("application_name=", 1)[1]
    dropped = await sql(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = %s AND pid <> pg_backend_pid()",
        (schema,),
    )
    assert dropped  # the pool's connections were there to drop
    assert await pg.provider_pref("slack", "C1") == "fast"
    await pg.set_provider_pref("slack", "C1", "smart")
    assert await pg.provider_pref("slack", "C1") == "smart"


def test_the_password_is_given_to_the_connection_not_taken_from_the_url(url: str) -> None:
    from core.store.postgres_db import connection_kwargs

    assert connection_kwargs(url, "from-the-env")["password"] == "from-the-env"
    assert "password" not in connection_kwargs(url, None)
