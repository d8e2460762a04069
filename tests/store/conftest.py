"""The `store` fixture: every test in tests/store runs once per backend.

A backend is one factory in `BACKENDS`: given a test's temporary directory it opens that
test's store, and opening it again (`reopen`) reaches the same data. PostgreSQL joins by
adding its factory (one database or schema per test directory, skipped when no server is
configured).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from core.store import Store, open_store

Reopen = Callable[[], Awaitable[Store]]


async def _sqlite(tmp_path: Path) -> Store:
    return await open_store(tmp_path / "parley.db")


BACKENDS: dict[str, Callable[[Path], Awaitable[Store]]] = {
    "sqlite": _sqlite,
}


@pytest.fixture(params=sorted(BACKENDS))
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    """Opens this test's store (again): a new `Store` on the same data each call."""
    factory = BACKENDS[request.param]
    return lambda: factory(tmp_path)


@pytest.fixture
async def store(reopen: Reopen) -> AsyncIterator[Store]:
    """This test's store, empty, closed after the test."""
    opened = await reopen()
    try:
        yield opened
    finally:
        await opened.aclose()
