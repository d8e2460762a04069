"""A store from before long-term memory (schema 4) gets its memories table and full-text
index on open, on both backends, and keeps what it held."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import Scope, open_store
from core.store import migrations as sqlite_schema
from tests.store.conftest import store_at

BEFORE_MEMORY = 4
RUN = (
    "INSERT INTO runs (id, conv, state, trigger, created_at, text) "
    "VALUES ('r1', 'test:c1:', 'completed', 'user', 1.0, 'from before')"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with store_at(request.param, tmp_path, BEFORE_MEMORY, RUN) as where:
        yield where


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
