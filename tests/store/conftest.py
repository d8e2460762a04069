"""The `store` fixture: every test in tests/store runs once per backend.

A backend is one factory in `BACKENDS`: given a test's temporary directory it sets up a
place for that test's data and yields `reopen`, which opens a new `Store` on that same
data each call; leaving the factory's context removes the place.

PostgreSQL gets a fresh schema per test on the server `PARLEY_TEST_POSTGRES_URL` names
(default: `postgresql://postgres@127.0.0.1:5432/test`), dropped after the test. Where no
server answers, its tests skip — unless `PARLEY_REQUIRE_POSTGRES=1` (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from core.store import Store, open_store

Reopen = Callable[[], Awaitable[Store]]
Backend = Callable[[Path], contextlib.AbstractAsyncContextManager[Reopen]]

POSTGRES_URL = os.environ.get(
    "PARLEY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


@contextlib.asynccontextmanager
async def _sqlite(tmp_path: Path) -> AsyncIterator[Reopen]:
    yield lambda: open_store(tmp_path / "parley.db")


@contextlib.asynccontextmanager
async def postgres_schema() -> AsyncIterator[str]:
    """A URL whose connections work in a new, empty schema (and are named after it in
    `pg_stat_activity.application_name`), dropped on leaving."""
    admin = await _postgres_admin()
    schema = f"parley_test_{uuid.uuid4().hex[:12]}"
    async with admin:
        await admin.execute(f"CREATE SCHEMA {schema}")
        try:
            # the schema also names the connections, so a test can find its own
            query = f"options=-csearch_path%3D{schema}&application_name={schema}"
            yield f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}{query}"
        finally:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")


@contextlib.asynccontextmanager
async def store_at(backend: str, tmp_path: Path, version: int, *seed: str) -> AsyncIterator[str]:
    """A store as a Parley of schema `version` left it, holding what the `seed` statements
    insert; yields what `open_store` is given (a path or a URL)."""
    if backend == "sqlite":
        from core.store import migrations as sqlite_schema

        path = tmp_path / "parley.db"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for step in range(1, version + 1):
                db.executescript(sqlite_schema._MIGRATIONS[step])
                db.execute("INSERT INTO schema_version VALUES (?)", (step,))
            for statement in seed:
                db.execute(statement)
        db.close()
        yield str(path)
        return
    async with postgres_schema() as url:  # skips if there is no server (or no psycopg)
        import psycopg

        from core.store import postgres_schema as pg_schema

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
            await pg.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            for step in range(1, version + 1):
                await pg.execute(pg_schema._MIGRATIONS[step].encode())
                await pg.execute("INSERT INTO schema_version VALUES (%s)", (step,))
            for statement in seed:
                await pg.execute(statement.encode())
        yield url


@contextlib.asynccontextmanager
async def _postgres(tmp_path: Path) -> AsyncIterator[Reopen]:
    async with postgres_schema() as url:
        yield lambda: open_store(url)


BACKENDS: dict[str, Backend] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
}


_unavailable: list[str] = []  # why the first try found no server: later tests skip at once


async def _postgres_admin() -> Any:
    """A connection to the test server, or the test skips (fails under
    PARLEY_REQUIRE_POSTGRES=1) saying why there is none."""
    if _unavailable:
        unavailable(_unavailable[0])
    try:
        import psycopg
    except ImportError as exc:
        _unavailable.append(f"psycopg is not installed ({exc}): pip install -e '.[dev]'")
        unavailable(_unavailable[0])
    try:
        return await psycopg.AsyncConnection.connect(
            POSTGRES_URL, autocommit=True, connect_timeout=3
        )
    except psycopg.OperationalError as exc:
        _unavailable.append(f"no PostgreSQL at {POSTGRES_URL} ({str(exc).strip()})")
        unavailable(_unavailable[0])


def unavailable(reason: str) -> NoReturn:
    """Skip this PostgreSQL test, or fail it where PostgreSQL is required."""
    if os.environ.get("PARLEY_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason}, and PARLEY_REQUIRE_POSTGRES=1")
    pytest.skip(reason)


shared_only = pytest.mark.parametrize("reopen", ["postgres"], indirect=True)
"""A test of what only a store several workers share does (`core.store.SharedStore`):
PostgreSQL alone."""


@pytest.fixture(params=sorted(BACKENDS))
async def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Reopen]:
    """Opens this test's store (again): a new `Store` on the same data each call."""
    async with BACKENDS[request.param](tmp_path) as opener:
        yield opener


@pytest.fixture
async def store(reopen: Reopen) -> AsyncIterator[Store]:
    """This test's store, empty, closed after the test."""
    opened = await reopen()
    try:
        yield opened
    finally:
        await opened.aclose()
