"""`open_store`: which backend a path or URL names, and what a bad one says (docs/scale-out.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.store import open_store
from tests.store.conftest import postgres_schema


async def test_a_path_and_a_sqlite_url_open_the_same_database(tmp_path: Path) -> None:
    async with await open_store(tmp_path / "parley.db") as store:
        await store.set_provider_pref("slack", "C1", "fast")
    async with await open_store(f"sqlite:///{tmp_path}/parley.db") as store:  # 4 slashes
        assert await store.provider_pref("slack", "C1") == "fast"
    async with await open_store(str(tmp_path / "parley.db")) as store:
        assert await store.provider_pref("slack", "C1") == "fast"


async def test_a_sqlite_url_with_three_slashes_is_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with await open_store("sqlite:///state/parley.db"):
        pass
    assert (tmp_path / "state" / "parley.db").is_file()


async def test_postgresql_urls_in_each_spelling_open_the_same_schema() -> None:
    async with postgres_schema() as url:
        async with await open_store(url) as store:
            await store.set_provider_pref("slack", "C1", "fast")
        for spelling in ("postgres://", "postgresql+psycopg://", "PostgreSQL://"):
            again = spelling + url.removeprefix("postgresql://")
            async with await open_store(again) as store:
                assert await store.provider_pref("slack", "C1") == "fast"


async def test_an_unreachable_postgresql_server_is_a_config_error_naming_the_url() -> None:
    with pytest.raises(ConfigError, match=r"store\.url.*cannot open the PostgreSQL store") as err:
        await open_store("postgresql://parley@127.0.0.1:1/parley?connect_timeout=2")
    assert "127.0.0.1:1/parley" in str(err.value)
    assert "store.password_env" in err.value.fix


async def test_a_password_in_the_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match="holds a password") as err:
        await open_store("postgresql://parley:hunter2@127.0.0.1/parley")
    assert "hunter2" not in str(err.value)
    assert "store.password_env" in err.value.fix


async def test_a_malformed_postgresql_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a PostgreSQL URL") as err:
        await open_store("postgresql://127.0.0.1/parley?no_such_option=1")
    assert err.value.key == "store.url"


@pytest.mark.parametrize("url", ["mysql://db/parley", "sqlite:///", "sqlite://host/parley.db"])
async def test_a_url_that_names_no_store_is_a_config_error(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fix: give a SQLite file path or a PostgreSQL URL"):
        await open_store(url)


async def test_a_sqlite_store_that_fails_to_open_leaves_no_thread_behind(tmp_path: Path) -> None:
    """aiosqlite's thread is not a daemon: one left open keeps the process from exiting."""
    import sqlite3
    import threading

    from core.store.migrations import SCHEMA_VERSION
    from core.store.sqlite import SqliteStore

    db = tmp_path / "parley.db"
    with sqlite3.connect(db) as conn:  # a database from a newer Parley: refused
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))

    def workers() -> int:
        return sum(1 for t in threading.enumerate() if "_connection_worker" in t.name)

    before = workers()
    with pytest.raises(RuntimeError, match="newer Parley"):
        await SqliteStore.open(db)
    # A closed connection's thread ends just after its close returns (and an earlier
    # test's may still be ending): wait for the count to come back, never for good.
    for _ in range(250):
        if workers() <= before:
            break
        await asyncio.sleep(0.02)
    assert workers() <= before
