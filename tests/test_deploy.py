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
    assert set(services) == {"db", "worker-1", "worker-2", "prometheus"}
    assert services["db"]["image"].startswith("postgres:")
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker["build"]["context"] == ".."
        assert (DEPLOY / worker["build"]["context"] / "Dockerfile").exists()
        assert worker["depends_on"]["db"]["condition"] == "service_healthy"
        assert "./config.toml:/app/config.toml:ro" in worker["volumes"]
        assert "PARLEY_DB_PASSWORD" in worker["environment"]
        assert "/readyz" in " ".join(worker["healthcheck"]["test"])
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


# ---- monitoring: Prometheus, its alert rules, the Grafana dashboard (docs/operations.md) ----


def _metric_names() -> set[str]:
    """Every metric name Parley exports (counters with `_total`, histograms' series)."""
    from core import metrics

    registry = metrics.enable()
    try:
        names: set[str] = set()
        for family in registry.collect():
            names.add(family.name)
            if family.type == "counter":
                names.add(f"{family.name}_total")
            elif family.type == "histogram":
                names |= {f"{family.name}_{end}" for end in ("bucket", "count", "sum")}
    finally:
        metrics.disable()
    # read when scraped, from the server's callbacks (bot/server.py)
    return names | {
        "parley_queue_depth",
        "parley_lanes_running",
        "parley_leases_held",
        "parley_worker_heartbeat_fresh",
    }


def _used(text: str) -> set[str]:
    import re

    return set(re.findall(r"\bparley_[a-z_]+\b", text))


def test_prometheus_scrapes_both_workers_and_loads_the_rules() -> None:
    services = compose()["services"]
    assert "prometheus" in services
    mounts = " ".join(services["prometheus"]["volumes"])
    assert "prometheus.yml" in mounts and "alerts.yml" in mounts  # noqa: PT018
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    listen = load_config(DEPLOY / "config.toml").server.listen
    assert listen is not None
    port = listen.rsplit(":", 1)[1]
    assert sorted(targets) == [f"worker-1:{port}", f"worker-2:{port}"]
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_the_alert_rules_use_metrics_parley_exports() -> None:
    text = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    rules = yaml.safe_load(text)["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "ParleyTelegramLeaseUnheld",
        "ParleyLLMErrorRateHigh",
        "ParleyQueueGrowing",
        "ParleyWorkerNotReady",
    }
    assert all(r["expr"] and r["for"] and r["annotations"]["summary"] for r in rules)
    assert _used(text) <= _metric_names(), _used(text) - _metric_names()


def test_the_dashboard_shows_turns_latency_errors_cost_queue_and_leases() -> None:
    import json

    text = (DEPLOY / "grafana" / "parley.json").read_text()
    board = json.loads(text)
    titles = " ".join(p["title"] for p in board["panels"]).lower()
    for word in ("turns", "latency", "errors", "cost", "queue", "leases"):
        assert word in titles, word
    used = _used(text)
    assert used <= _metric_names(), used - _metric_names()
