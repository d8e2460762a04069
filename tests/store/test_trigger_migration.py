"""A store at schema 15 (before trigger deliveries) is brought to 16 on open on both
backends: it keeps its data and takes deliveries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import TriggerDelivery, open_store
from core.store.schema import SCHEMA_VERSION
from tests.store.conftest import store_at

OLD = 15
QUEUED_RUN = (
    "INSERT INTO runs (id, conv, state, trigger, created_at, text) "
    "VALUES ('r1', 'test:c1:', 'queued', 'user', 1.0, 'from before')"
)


@pytest.fixture(params=["sqlite", "postgres"])
async def store_at_15(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store at schema `OLD` holding one queued run; what `open_store` is given."""
    async with store_at(request.param, tmp_path, OLD, QUEUED_RUN) as where:
        yield where


async def test_a_store_at_15_gains_trigger_deliveries_and_keeps_its_runs(store_at_15: str) -> None:
    assert SCHEMA_VERSION >= OLD + 1
    async with await open_store(store_at_15) as store:
        run = await store.run("r1")
        assert run is not None
        assert (run.state, run.text) == ("queued", "from before")
        first = TriggerDelivery("ci", "d1", 5.0, "push", "accepted")
        assert await store.record_delivery(first) is True
    async with await open_store(store_at_15) as store:  # opening it again changes nothing
        assert await store.record_delivery(first) is False
        assert await store.last_deliveries() == {"ci": first}
