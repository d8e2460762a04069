"""A store from before long-term memory (schema 4) gets its memories table and full-text
index on open, on both backends, and keeps what it held."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import Scope, open_store
from core.store import migrations as sqlite_schema
from tests.store.conftest import postgres_schema

BEFORE_MEMORY = 4
RUN = (
    "INSERT INTO runs (id, conv, state, trigger, created_at, text) "
    "VALUES ('r1', 'test:c1:', 'completed', 'user', 1.0, 'from before')"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "parley.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in range(1, BEFORE_MEMORY + 1):
                conn.executescript(sqlite_schema._MIGRATIONS[version])
                conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
            conn.execute(RUN)
        conn.close()
        yield str(path)
        return
    async with postgres_schema() as url:
        import psycopg

        from core.store import postgres_schema as pg_schema

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in range(1, BEFORE_MEMORY + 1):
                await conn.execute(pg_schema._MIGRATIONS[version])
                await conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))
            await conn.execute(RUN)
        yield url


async def test_a_store_from_before_memory_gains_it_and_keeps_its_runs(old_store: str) -> None:
    here = Scope("conversation", "test:c1:")
    async with await open_store(old_store) as store:
        run = await store.run("r1")
        assert run is not None
        assert run.text == "from before"
        made = await store.remember(here, "the migration kept everything", made_by="u", conv="c")
    async with await open_store(old_store) as store:
        assert [m.id for m in await store.recall("migration", [here])] == [made.id]


def test_the_migration_script_splits_at_trigger_ends_only() -> None:
    (script,) = (s for s in sqlite_schema._MIGRATIONS.values() if "memories_fts" in s)
    found = sqlite_schema.statements(script)
    triggers = [s for s in found if s.startswith("CREATE TRIGGER")]
    assert len(triggers) == 3
    assert all(s.rstrip().endswith("END;") for s in triggers)
    assert all(sqlite3.complete_statement(s) for s in found)
