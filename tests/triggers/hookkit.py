"""A running `parley run` serving triggers, as a user starts it: the fake LLM, the fake
Slack, `[server] listen` on a free port, and `[triggers.NAME]` tables; deliveries signed
as their sources sign them (`core.triggers.verify.sign`) and sent over real HTTP."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from core.triggers.verify import sign
from tests.channels.test_stored_before_ack import Parley, free_port, parley_run
from tests.fakes.slack import FakeSlack
from tests.process import slack_run_config

SECRET = "gh-secret"
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
    source: str = "github",
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


@asynccontextmanager
async def serving(
    tmp_path: Path, llm_url: str, slack: FakeSlack, triggers: str = CI_TRIGGER, **env: str
) -> AsyncIterator[tuple[Parley, str]]:
    """`parley run` with the fake Slack and `triggers`; yields it and its base URL."""
    port = free_port()
    config, environ = slack_run_config(
        tmp_path,
        llm_url,
        slack,
        f"""
        allow_channels = ["C1", "C2"]
        [server]
        listen = "127.0.0.1:{port}"
        """
        + triggers,
    )
    environ |= {"GITHUB_WEBHOOK_SECRET": SECRET} | env
    async with parley_run(config, environ) as parley:
        await parley.until(lambda: b"parley: ready" in parley.err, "start-up")
        await slack.connected()
        yield parley, f"http://127.0.0.1:{port}"


async def deliver(
    url: str, name: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        return await client.post(f"{url}/hooks/{name}", content=body, headers=headers)
