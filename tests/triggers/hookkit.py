"""A running `parley run` serving triggers, as a user starts it: the fake LLM, the fake
Slack, `[server] listen` on a free port, and `[triggers.NAME]` tables; deliveries signed
as their sources sign them (`core.triggers.verify.sign`) and sent over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from core.triggers.verify import Source, sign
from tests.channels.test_stored_before_ack import Parley, free_port, parley_run
from tests.fakes.slack import FakeSlack
from tests.process import slack_run_config
from tests.workerskit import shared_store

SECRET = "gh-secret"
STD_SECRET = "whsec_" + base64.b64encode(b"parley's standard webhooks key!!").decode()
CI_TRIGGER = """
[triggers.ci]
source = "github"
secret_env = "GITHUB_WEBHOOK_SECRET"
events = ["check_run"]
filter = "action == 'completed' and check_run.conclusion == 'failure'"
channel = "slack:C1"
thread_by = "{repository.full_name}#{check_run.head_sha}"
close_on = "check_run.name == 'all-green'"
prompt = "CI failed on {repository.full_name}: {check_run.name}. Find the cause."
"""


def check_run(
    name: str = "test (3.11)", sha: str = "abc123", conclusion: str = "failure", **extra: Any
) -> dict[str, Any]:
    return {
        "action": "completed",
        "check_run": {"name": name, "head_sha": sha, "conclusion": conclusion},
        "repository": {"full_name": "acme/widgets"},
        **extra,
    }


def signed(
    payload: dict[str, Any] | bytes,
    *,
    source: Source = "github",
    secret: str = SECRET,
    delivery: str | None = None,
    event: str = "check_run",
    now: float | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one delivery, signed as `source` signs."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    delivery = delivery or str(uuid.uuid4())
    headers = sign(source, secret, body, time.time() if now is None else now, delivery, event=event)
    return body, {**headers, "Content-Type": "application/json"}


def run_config(
    state: Path, llm_url: str, slack: FakeSlack, triggers: str, *, store_url: str = ""
) -> tuple[Path, dict[str, str], str]:
    """`parley run`'s config.toml under `state` (the fake LLM, the fake Slack, `[server]
    listen` on a free port, `triggers`; with `store_url`, the shared PostgreSQL store of
    `tests.workerskit.shared_store`), its environment and its base URL."""
    port = free_port()
    state.mkdir(parents=True, exist_ok=True)
    config, environ = slack_run_config(
        state,
        llm_url,
        slack,
        f"""
        allow_channels = ["C1", "C2"]
        [server]
        listen = "127.0.0.1:{port}"
        """
        + triggers,
    )
    if store_url:
        config.write_text(shared_store(config.read_text(), store_url))
    environ |= {"GITHUB_WEBHOOK_SECRET": SECRET, "STD_WEBHOOK_SECRET": STD_SECRET}
    return config, environ, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serving(
    tmp_path: Path, llm_url: str, slack: FakeSlack, triggers: str = CI_TRIGGER, **env: str
) -> AsyncIterator[tuple[Parley, str]]:
    """`parley run` with the fake Slack and `triggers`; yields it and its base URL."""
    config, environ, url = run_config(tmp_path, llm_url, slack, triggers)
    async with parley_run(config, environ | env) as parley:
        await parley.until(lambda: b"parley: ready" in parley.err, "start-up")
        await slack.connected()
        yield parley, url


async def within_one_minute(seconds: float = 6) -> None:
    """Until `seconds` are left in the current clock minute, the rate limit's window: a
    burst that must fall in one window does not straddle two."""
    if time.time() % 60 > 60 - seconds:
        await asyncio.sleep(60.5 - time.time() % 60)


async def deliver(url: str, name: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        return await client.post(f"{url}/hooks/{name}", content=body, headers=headers)


async def counted(url: str) -> dict[tuple[str, str], float]:
    """`parley_trigger_deliveries_total` as `/metrics` shows it: (trigger, outcome) → count."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "parley_trigger_deliveries_total":
                found[(sample.labels["trigger"], sample.labels["outcome"])] = sample.value
    return found


def stored_deliveries(db: Path) -> list[tuple[str, str, str]]:
    """The store's `trigger_deliveries` rows as (trigger, delivery id, outcome), sorted."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT trigger, delivery_id, outcome FROM trigger_deliveries "
            "ORDER BY trigger, delivery_id"
        )
        return [(str(t), str(d), str(o)) for t, d, o in rows]


def accepted_in_order(db: Path) -> list[str]:
    """The delivery ids of the accepted deliveries, in the order the store took their runs
    in (`runs.seq`)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT d.delivery_id FROM trigger_deliveries AS d JOIN runs AS r ON r.id = d.run_id "
            "ORDER BY r.seq"
        )
        return [str(d) for (d,) in rows]
