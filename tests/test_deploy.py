"""deploy/: the compose file (PostgreSQL and two workers) and the configuration it mounts.
Docker is not run here; the file is checked as YAML for what README promises, and the
configuration as Parley reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import load_config, parse_config
from core.errors import ConfigError
from tests.process import REPO

DEPLOY = REPO / "deploy"


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_runs_two_workers_of_one_image_on_one_postgres() -> None:
    services = compose()["services"]
    assert set(services) == {"db", "worker-1", "worker-2"}
    assert services["db"]["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker["build"]["context"] == ".."
        assert (DEPLOY / worker["build"]["context"] / "Dockerfile").exists()
        assert worker["depends_on"]["db"]["condition"] == "service_healthy"
        assert "./config.toml:/app/config.toml:ro" in worker["volumes"]
        assert "PARLEY_DB_PASSWORD" in worker["environment"]
    volumes = [services[n]["volumes"][1] for n in ("worker-1", "worker-2")]
    assert len(set(volumes)) == 2  # each worker its own state volume


def test_the_mounted_config_is_a_shared_store_with_leases() -> None:
    config = load_config(DEPLOY / "config.toml")
    store = config.store
    assert store.shared()
    assert store.url == "postgresql://parley@db:5432/parley"
    assert store.password_env == "PARLEY_DB_PASSWORD"
    env_names = compose()["services"]["worker-1"]["environment"]
    assert store.password_env in env_names


@pytest.mark.parametrize("value", [0, 0.5, 301, "soon"])
def test_a_bad_lease_time_names_the_key(value: object) -> None:
    raw: dict[str, Any] = {
        "default_provider": "p",
        "providers": {"p": {"kind": "openai_chat", "base_url": "http://x", "model": "m"}},
        "store": {"url": "postgresql://parley@db/parley", "lease_seconds": value},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert "store.lease_seconds" in str(caught.value)


def test_the_repository_config_documents_the_lease_key() -> None:
    assert "lease_seconds" in (REPO / "config.toml").read_text()
    assert Path(DEPLOY / "config.toml").read_text().count("lease_seconds") == 1
