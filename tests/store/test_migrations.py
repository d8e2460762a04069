"""A store an older Parley left behind is brought up to date on open, and keeps its data:
both backends, from schema 3 (before workers, leases and `runs.worker`)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import migrations as sqlite_schema
from core.store import open_store
from tests.store.conftest import postgres_schema

OLD = 3
# Stored out of `created_at` order (as two workers' clocks can): the older Parley handed
# them out by `created_at`, and the migrated store keeps that order.
QUEUED_RUN = (
    "INSERT INTO runs (id, conv, state, trigger, created_at, text) VALUES "
    "('r2', 'test:c1:', 'queued', 'user', 2.0, 'then this'), "
    "('r1', 'test:c1:', 'queued', 'user', 1.0, 'from before')"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store at schema `OLD` holding one queued run; what `open_store` is given."""
    if request.param == "sqlite":
        path = tmp_path / "parley.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in range(1, OLD + 1):
                conn.executescript(sqlite_schema._MIGRATIONS[version])
                conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
            conn.execute(QUEUED_RUN)
        conn.close()
        yield str(path)
        return
    async with postgres_schema() as url:  # skips if there is no server (or no psycopg)
        import psycopg

        from core.store import postgres_schema as pg_schema

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in range(1, OLD + 1):
                await conn.execute(pg_schema._MIGRATIONS[version])
                await conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))
            await conn.execute(QUEUED_RUN)
        yield url


async def test_an_older_store_is_migrated_and_keeps_its_runs(old_store: str) -> None:
    assert sqlite_schema.SCHEMA_VERSION > OLD
    async with await open_store(old_store) as store:
        run = await store.run("r1")
        assert run is not None
        assert (run.state, run.text, run.worker) == ("queued", "from before", None)
        claimed = await store.claim_queued_run("w1")
        assert claimed is not None
        assert (claimed.id, claimed.worker) == ("r1", "w1")
        await store.create_run("r3", "test:c1:", "user", state="queued", shared=True)
    async with await open_store(old_store) as store:  # opening a current store changes nothing
        assert await store.claim_queued_run("w2") is None  # r1 runs
        store.set_run_state("r1", "completed", "")
        second = await store.claim_queued_run("w2")
        assert second is not None
        assert second.id == "r2"
        assert [r.id for r in await store.runs(conv="test:c1:")] == ["r3", "r2", "r1"]
