"""A store at schema 15 (before trigger deliveries) is brought to 16 on open on both
backends: it keeps its data and takes deliveries."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import TriggerDelivery, open_store
from core.store import migrations as sqlite_schema
from core.store.schema import SCHEMA_VERSION
from tests.store.conftest import postgres_schema

OLD = 15
QUEUED_RUN = (
    "INSERT INTO runs (id, conv, state, trigger, created_at, text) "
    "VALUES ('r1', 'test:c1:', 'queued', 'user', 1.0, 'from before')"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def store_at_15(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store at schema 15 holding one queued run; what `open_store` is given."""
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

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
            await pg.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for version in range(1, OLD + 1):
                await pg.execute(pg_schema._MIGRATIONS[version].encode())
                await pg.execute("INSERT INTO schema_version VALUES (%s)", (version,))
            await pg.execute(QUEUED_RUN)
        yield url


async def test_a_store_at_15_gains_trigger_deliveries_and_keeps_its_runs(store_at_15: str) -> None:
    assert SCHEMA_VERSION == OLD + 1
    async with await open_store(store_at_15) as store:
        run = await store.run("r1")
        assert run is not None
        assert (run.state, run.text) == ("queued", "from before")
        first = TriggerDelivery("ci", "d1", 5.0, "push", "accepted")
        assert await store.record_delivery(first) is True
    async with await open_store(store_at_15) as store:  # opening it again changes nothing
        assert await store.record_delivery(first) is False
        assert await store.last_deliveries() == {"ci": first}
