"""`[store]` in config.toml (docs/operations.md, docs/scale-out.md): a SQLite path by default, or a
URL; the
PostgreSQL password from the variable `password_env` names; a bad URL says which key and
how to fix it. And the durable agent and `parley runs` on the store the config names."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bot.app import shared_settings
from bot.config import ParleyConfig, parse_config
from bot.inspect import runs_command
from core.errors import ConfigError
from core.store import open_store
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.store.conftest import POSTGRES_URL, postgres_schema


def config(**store: Any) -> ParleyConfig:
    return parse_config(
        {
            "default_provider": "p",
            "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
            "store": store,
        }
    )


def test_the_default_store_is_the_sqlite_file_in_the_home() -> None:
    store = config().store
    assert store.backend() == "sqlite"
    assert store.resolved() == Path("~/.parley/parley.db").expanduser().resolve()
    assert store.target() == store.resolved()


def test_a_sqlite_url_names_the_file(tmp_path: Path) -> None:
    store = config(url=f"sqlite:///{tmp_path}/state.db").store
    assert (store.backend(), store.resolved(), store.target()) == (
        "sqlite",
        tmp_path / "state.db",
        tmp_path / "state.db",
    )


def test_an_empty_url_is_unset() -> None:
    assert config(url="").store.backend() == "sqlite"


def test_a_postgresql_url_with_its_password_from_the_environment() -> None:
    store = config(url="postgres://parley@db:5432/parley", password_env="PARLEY_DB_PASSWORD").store
    assert store.backend() == "postgresql"
    assert store.target() == "postgresql://parley@db:5432/parley"
    assert store.password({"PARLEY_DB_PASSWORD": "s3cret"}) == "s3cret"
    assert store.password({}) is None
    assert config(url="postgresql://db/parley").store.password({"PGPASSWORD": "x"}) is None


@pytest.mark.parametrize(
    ("store", "problem", "fix"),
    [
        ({"url": "mysql://db/parley"}, "not a store Parley knows", "postgresql://USER@HOST"),
        ({"url": "postgresql://parley:hunter2@db/parley"}, "holds a password", "password_env"),
        ({"url": "postgresql://db/parley?password=hunter2"}, "holds a password", "password_env"),
        ({"url": "sqlite:///"}, "names no database file", "sqlite:///<path>"),
        # libpq's defaults would pick the server and the database, and Parley migrate it
        ({"url": "postgresql://"}, "names no host and no database name", "USER@HOST:5432/"),
        ({"url": "postgresql://parley@db.internal"}, "names no database name", "DATABASE"),
        ({"url": "postgresql:///parley"}, "names no host", "?host=/var/run/postgresql"),
        ({"url": "postgres://db:5432/"}, "names no database name", "DATABASE"),
    ],
)
def test_a_bad_url_names_the_key_and_the_fix(store: dict[str, str], problem: str, fix: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(**store)
    assert err.value.key == "store.url"
    assert problem in err.value.problem
    assert fix in err.value.fix
    assert "hunter2" not in str(err.value)


def test_a_host_and_a_database_may_be_given_as_libpq_parameters() -> None:
    assert config(url="postgresql:///parley?host=/var/run/postgresql").store.backend() == (
        "postgresql"
    )
    assert config(url="postgresql://db?dbname=parley").store.backend() == "postgresql"


async def test_the_opened_postgresql_store_says_host_port_and_database_never_a_password() -> None:
    async with postgres_schema() as url, await open_store(url, password="hunter2") as store:
        said = store.describe()
    given = urlsplit(POSTGRES_URL)
    where = f"{given.hostname}:{given.port or 5432} database {given.path.strip('/')}"
    assert said.startswith(f"PostgreSQL {where} schema parley_test_"), said
    assert "hunter2" not in said


def test_a_path_and_a_url_at_once_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="both `path` and `url`") as err:
        config(path="/tmp/parley.db", url="postgresql://db/parley")
    assert err.value.key == "store"


def test_a_worker_timeout_shorter_than_two_heartbeats_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        config(heartbeat_seconds=5, worker_timeout_seconds=6)
    assert err.value.key == "store"
    assert "`worker_timeout_seconds` (6)" in err.value.problem
    assert "2 × `heartbeat_seconds`" in err.value.fix
    with pytest.raises(ConfigError) as err:
        config(heartbeat_seconds=0)
    assert err.value.key == "store.heartbeat_seconds"


def test_workers_share_only_on_postgresql() -> None:
    assert shared_settings(config().store, ["slack"]) is None
    settings = shared_settings(
        config(url="postgresql://db/parley", heartbeat_seconds=1, worker_max_runs=4).store,
        ["slack", "telegram"],
    )
    assert settings is not None
    assert (settings.heartbeat, settings.timeout, settings.sweep, settings.max_runs) == (
        1.0,
        10.0,
        5.0,
        4,
    )
    assert settings.channels == {"slack", "telegram"}


async def test_a_turn_on_the_postgresql_store_is_kept_there(
    fake_llm: FakeLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "n.txt", "content": "hi"})]),
        Reply(text="Written."),
    )
    async with postgres_schema() as url:
        store = {"path": None, "url": url}
        async with running_agent(fake_llm, tmp_path, store=store) as agent:
            responder = RecordingResponder()
            await agent.submit(inbound("write it"), responder)
            await agent.wait_idle()
            assert responder.finals == ["Written."]
        assert not (tmp_path / "parley.db").exists()
        async with await open_store(url) as stored:
            [run] = await stored.runs()
            assert (run.state, run.text) == ("completed", "Written.")
            assert [c.name for c in (await stored.tool_calls(run.id)).values()] == ["write_file"]
            assert (await stored.load_messages("test:c1:"))[-1].content == "Written."
        configured = config(url=url)
        assert await runs_command(configured, None, None, 10, {}) == 0
        assert run.id in capsys.readouterr().out
