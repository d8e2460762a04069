"""`open_store`: which backend a path or URL names (SPEC §14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.store import open_store


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


@pytest.mark.parametrize(
    "url",
    ["postgresql://parley@db.internal/parley", "postgres://db/p", "postgresql+asyncpg://db/p"],
)
async def test_a_postgresql_store_is_not_available_yet(url: str) -> None:
    with pytest.raises(ConfigError, match="PostgreSQL store is not available yet"):
        await open_store(url)


@pytest.mark.parametrize("url", ["mysql://db/parley", "sqlite:///", "sqlite://host/parley.db"])
async def test_a_url_that_names_no_store_is_a_config_error(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fix: give a file path"):
        await open_store(url)
