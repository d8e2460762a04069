"""`parley run` with `[server] listen`, the fake LLM and the fake Telegram, as an operator
sees it (docs/operations.md#operating-parley): `/metrics` scraped and parsed with
prometheus-client's own parser moves by exactly the scripted turns, tools and errors;
`/readyz` turns 503 while Telegram is unreachable and back; the JSON log line of the
failing run carries its run id and no secret."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.channels.test_stored_before_ack import Parley
from tests.fakes.holding_proxy import HoldingProxy
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, start_parley, telegram_run_config
from tests.store.conftest import postgres_schema
from tests.workerskit import shared_store

ALICE = TgUser(111, "Alice", "alice")
MALLORY = TgUser(666, "Mallory", "mallory")
TOKEN = "123456:TEST-token"
API_KEY = "sk-canary-7f3a9e2b41d0c8"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    """The sum over the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= ls)


async def start(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, *, store: str | None = None
) -> tuple[Parley, str]:
    """`parley run` with the endpoint on a free port (and its URL); `store`: a PostgreSQL
    URL instead of the SQLite file."""
    config = telegram_run_config(
        tmp_path,
        fake_llm.base_url,
        telegram.url,
        ALICE.id,
        """
        [server]
        listen = "127.0.0.1:0"
        [log]
        format = "json"
        """,
    )
    text = config.read_text().replace(
        'model = "fake-model"', 'model = "fake-model"\napi_key_env = "FAKE_LLM_KEY"', 1
    )
    if store is not None:
        text = shared_store(text, store)
    config.write_text(text)
    env = child_env(TELEGRAM_BOT_TOKEN=TOKEN, FAKE_LLM_KEY=API_KEY)
    proc = await start_parley("--config", str(config), "run", env=env, stdin=False)
    parley = Parley(proc)
    await parley.until(lambda: b"parley: ready" in parley.err, "start-up", timeout=60)
    found = re.search(rb"operator's endpoint on (http://[0-9.]+:[0-9]+)", parley.err)
    assert found, parley.err.decode()
    return parley, found.group(1).decode()


async def test_metrics_move_by_the_scripted_turns_tools_and_errors(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "x"})]),
        Reply(text="wrote it", usage=(50, 5)),
        Reply(fault=Fault(status=400, message="bad request", echo_key=True)),
    )
    async with FakeTelegram(token=TOKEN) as telegram:
        parley, url = await start(tmp_path, fake_llm, telegram)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                assert (await http.get("/healthz")).status_code == 200
                before = samples((await http.get("/metrics")).text)
                assert value(before, "parley_runs_started_total") == 0

                telegram.dm(ALICE, "write a file")
                await parley.until(lambda: "wrote it" in telegram.texts(ALICE.id), "answer")
                telegram.dm(ALICE, "again")
                await parley.until(
                    lambda: any("failed" in t for t in telegram.texts(ALICE.id)), "failure"
                )
                await parley.until(lambda: b"run_id" in parley.err, "the failure's log line")
                response = await http.get("/metrics")
                assert response.headers["content-type"].startswith("text/plain")
                after = samples(response.text)

                ready = await http.get("/readyz")
                assert ready.status_code == 200, ready.text

                # Telegram stops answering: not ready, naming it; then back.
                telegram.fail_next("getUpdates", 502, times=1_000_000)
                telegram.dm(MALLORY, "wake the long poll")  # not allowed: no turn
                body = await _until_status(parley, http, 503)
                assert set(body["not_ready"]) == {"channel:telegram"}, body
                telegram.clear_failures()
                await _until_status(parley, http, 200)
                retried = samples((await http.get("/metrics")).text)
        finally:
            code = await parley.stop()
    assert code == 0, parley.err.decode()

    assert value(after, "parley_runs_started_total", channel="telegram", trigger="user") == 2
    assert value(after, "parley_runs_total", state="completed", channel="telegram") == 1
    assert value(after, "parley_runs_total", state="failed", channel="telegram") == 1
    assert value(after, "parley_llm_calls_total", provider="fake", model="fake-model") == 2
    assert value(after, "parley_llm_call_seconds_count", provider="fake") == 2
    assert value(after, "parley_llm_time_to_first_token_seconds_count", provider="fake") == 2
    assert value(after, "parley_llm_errors_total", provider="fake", kind="other") == 1
    assert value(after, "parley_llm_errors_total") == 1
    assert value(after, "parley_llm_tokens_total", type="output") >= 5
    assert value(after, "parley_llm_tokens_total", type="input") >= 50
    assert value(after, "parley_tool_calls_total", tool="write_file", outcome="ok") == 1
    assert value(after, "parley_tool_calls_total") == 1
    assert value(after, "parley_tool_call_seconds_count", tool="write_file") == 1
    assert value(after, "parley_channel_api_calls_total", platform="telegram", outcome="ok") > 0
    assert value(after, "parley_store_commit_seconds_count") > 0
    assert value(after, "parley_queue_depth") == 0
    assert value(after, "parley_lanes_running") == 0
    # bounded labels: no chat, user or run id anywhere
    labels = {v for (_, ls) in after for _, v in ls}
    assert not any(str(ALICE.id) in v or "telegram:" in v for v in labels), labels
    # Telegram's outage was counted as failed tries and retries
    assert value(retried, "parley_channel_api_calls_total", outcome="unavailable") >= 1
    assert value(retried, "parley_channel_api_retries_total", platform="telegram") >= 1

    # The failing run's JSON log line: its run id, its conversation, and no secret.
    lines = [json.loads(line) for line in parley.err.decode().splitlines() if line[:1] == "{"]
    failed = [line for line in lines if "failed" in line["message"] and line.get("run_id")]
    assert failed, parley.err.decode()
    line = failed[0]
    assert line["level"] == "warning"
    assert line["conv"].startswith("telegram:")
    assert set(line) >= {"time", "level", "logger", "message", "run_id", "conv", "worker"}
    assert line["message"].startswith(f"run {line['run_id']} failed")
    assert API_KEY not in parley.err.decode()
    assert "write a file" not in parley.err.decode()  # no message text at info


async def _until_status(parley: Parley, http: httpx.AsyncClient, status: int) -> dict[str, Any]:
    """Poll /readyz until it answers `status` (for at most about 60 s); that answer's body."""
    for _ in range(1200):
        response = await http.get("/readyz")
        if response.status_code == status:
            body = response.json()
            assert isinstance(body, dict)
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"/readyz never answered {status}\n{parley.err.decode()}")


@pytest.mark.store_failures_expected
async def test_readyz_is_503_while_the_store_does_not_answer_then_200(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with (
        postgres_schema() as direct,
        HoldingProxy.before(direct) as proxy,
        FakeTelegram(token=TOKEN) as telegram,
    ):
        parley, url = await start(tmp_path, fake_llm, telegram, store=proxy.url(direct))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                await _until_status(parley, http, 200)  # the first heartbeat is in
                proxy.cut()
                body = await _until_status(parley, http, 503)
                assert "store" in body["not_ready"], body
                proxy.mend()
                # (a pooled connection the cut broke may fail one more read: polled)
                body = await _until_status(parley, http, 200)
                assert body == {"ready": True, "not_ready": {}}
                for _ in range(1200):  # the Telegram lease is held (again) within ~60 s
                    found = samples((await http.get("/metrics")).text)
                    if value(found, "parley_leases_held") == 1:
                        break
                    await asyncio.sleep(0.05)
        finally:
            code = await parley.stop()
    assert code == 0, parley.err.decode()
    assert value(found, "parley_worker_heartbeats_total", outcome="ok") > 0
    assert value(found, "parley_leases_held") == 1
    leases = {dict(ls)["lease"] for (n, ls) in found if n == "parley_leases_held"}
    assert len(leases) == 1, leases
    assert next(iter(leases)).startswith("telegram:poll:")
    assert value(found, "parley_lease_changes_total", change="taken") >= 1
    assert any(n == "parley_worker_heartbeat_fresh" for n, _ in found)
