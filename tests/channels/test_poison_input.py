"""Poison input (issue 38, item 7), sent the way it was found: one update python-telegram-bot
cannot parse, sitting in a batch between good ones; updates whose fields have the wrong
shape; a getUpdates answer the library cannot read; signed Slack requests whose body is not
JSON or not UTF-8. Nothing of it may stop intake, and none of it may cost a traceback.

The real PTB and slack-bolt run against the fakes; the agent is the real one (SQLite, and
PostgreSQL with the poll under its lease, where the poison once made the lease bounce)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest

from channels.telegram import TelegramChannel
from core.agent import Agent
from core.lease import LeaseHolder
from tests.agentkit import running_agent
from tests.channels.test_slack import config as slack_config
from tests.channels.test_slack import environ as slack_environ
from tests.channels.test_slack import final_text, slack_channel
from tests.channels.test_telegram import (
    ALICE,
    BOB,
    ENV,
    agent_on_telegram,
    config,
    free_port,
    telegram,
    wait_text,
)
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.store.conftest import postgres_schema


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=ENV["TELEGRAM_BOT_TOKEN"]) as server:
        yield server


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def echo(fake_llm: FakeLLM) -> None:
    """The model answers every message with `re: <the message>`."""

    async def answer(request: RecordedRequest) -> Reply:
        users = [m["content"] for m in request.json["messages"] if m["role"] == "user"]
        return Reply(text=f"re: {users[-1]}")

    fake_llm.responder = answer


def poison(chat_id: int = ALICE.id) -> dict[str, Any]:
    """A message update PTB cannot parse: its `chat` is no object (PTB raises TypeError)."""
    return {
        "message": {
            "message_id": 77,
            "date": 1_700_000_000,
            "chat": "not a chat",
            "from": ALICE.to_dict(),
            "text": "poison",
        }
    }


def message(**fields: Any) -> dict[str, Any]:
    """A DM update from Alice with `fields` replaced (a value of None removes the field)."""
    body: dict[str, Any] = {
        "message_id": 78,
        "date": 1_700_000_000,
        "chat": {"id": ALICE.id, "type": "private", "first_name": ALICE.first_name},
        "from": ALICE.to_dict(),
        "text": "hello",
    }
    body.update(fields)
    return {"message": {k: v for k, v in body.items() if v is not None}}


def unparsable_events(events_log: Path) -> list[dict[str, Any]]:
    lines = events_log.read_text().splitlines() if events_log.exists() else []
    events = [json.loads(line) for line in lines]
    return [e for e in events if e["event"] == "channel.event.unparsable"]


async def until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"no {what} within {timeout:g} s") from None


def offset(fake: FakeTelegram) -> int:
    """The offset of the latest getUpdates (0 before the first)."""
    polls = fake.calls_of("getUpdates")
    return int(polls[-1].params.get("offset") or 0) if polls else 0


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def warnings_of(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING
    ]


# ---- Telegram: long polling ---------------------------------------------------------------------


async def test_a_poison_update_between_two_good_ones_is_recorded_and_polling_goes_on(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    echo(fake_llm)
    # Queued before the channel starts: the first getUpdates returns all three at once.
    first = fake.dm(ALICE, "before")
    bad = fake.push_raw(poison())
    second = fake.dm(BOB, "after")
    assert first["update_id"] < bad["update_id"] < second["update_id"]
    caplog.set_level(logging.INFO)
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        await wait_text(fake, ALICE.id, "re: before")
        await wait_text(fake, BOB.id, "re: after")
        # Polling goes on. A poll waiting when the first batch was done may still carry the
        # old offset: the one that brings the second message was sent after the first
        # message came back, so it confirms all three.
        fake.dm(ALICE, "still there?")
        await wait_text(fake, ALICE.id, "re: still there?")
        fake.dm(BOB, "and again?")
        await wait_text(fake, BOB.id, "re: and again?")
        assert offset(fake) > second["update_id"]
        assert await agent.store.seen("telegram", str(bad["update_id"]))

    batches = [c.result for c in fake.calls_of("getUpdates") if c.result]
    assert [u["update_id"] for u in batches[0]] == [
        first["update_id"],
        bad["update_id"],
        second["update_id"],
    ]
    [recorded] = unparsable_events(tmp_path / "events.jsonl")
    assert recorded["channel"] == "telegram"
    assert recorded["id"] == str(bad["update_id"])
    assert json.loads(recorded["raw"]) == bad  # the update exactly as Telegram sent it
    assert "TypeError" in recorded["problem"]
    with closing(sqlite3.connect(tmp_path / "parley.db")) as db:  # and in the store's table
        rows = db.execute("SELECT data FROM events WHERE name = 'channel.event.unparsable'")
        [(stored,)] = rows.fetchall()
    assert json.loads(json.loads(stored)["raw"]) == bad
    [warning] = warnings_of(caplog, "channels.telegram")
    assert str(bad["update_id"]) in warning
    assert "channel.event.unparsable" in warning
    assert not tracebacks(caplog)
    assert len(fake_llm.requests) == 4


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"text": 5}, "text"),
        ({"chat": None}, "chat"),
    ],
    ids=["number-as-text", "no-chat"],
)
async def test_an_update_of_the_wrong_shape_costs_one_warning_line_and_no_traceback(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fields: dict[str, Any],
    why: str,
) -> None:
    echo(fake_llm)
    caplog.set_level(logging.INFO)
    async with agent_on_telegram(fake, fake_llm, tmp_path):
        odd = fake.push_raw(message(**fields))
        fake.dm(ALICE, "next")
        await wait_text(fake, ALICE.id, "re: next")
    [warning] = warnings_of(caplog, "channels.telegram")
    assert str(odd["update_id"]) in warning
    assert why in warning
    assert not tracebacks(caplog)
    [recorded] = unparsable_events(tmp_path / "events.jsonl")
    assert json.loads(recorded["raw"]) == odd
    assert len(fake_llm.requests) == 1  # the odd one never reached the model


async def test_a_failed_poller_is_restarted_with_backoff_on_its_clock(
    fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    """A getUpdates answer without `result` makes PTB raise KeyError, past the error
    mapping: the poll fails as a bug would. It is started again after 1, 2, 4 s."""
    clock = FakeClock()
    for _ in range(3):
        fake.answer_raw("getUpdates", {"ok": True})
    agent = RecordingAgent()
    async with telegram(fake, agent, clock=clock):
        fake.dm(ALICE, "are you there?")
        await wait_text(fake, ALICE.id, "echo: are you there?")
    restarts = [r for r in caplog.records if "polling failed" in r.getMessage()]
    assert [r.levelno for r in restarts] == [logging.ERROR] * 3
    assert [r.args[-1] for r in restarts if isinstance(r.args, tuple)] == [1.0, 2.0, 4.0]
    assert [s for s in clock.sleeps if s >= 1.0][:3] == [1.0, 2.0, 4.0]
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]


class RecordingAgent:
    """Stand-in agent: echoes messages, keeps what is set aside."""

    def __init__(self) -> None:
        self.set_aside: list[tuple[str, str, str, str]] = []

    async def submit(self, inbound: Any, responder: Any) -> bool:
        stream = responder.stream()
        await stream.finish(f"echo: {inbound.text}")
        return True

    async def record_unreadable(self, channel: str, event_id: str, problem: str, raw: str) -> None:
        self.set_aside.append((channel, event_id, problem, raw))


class RecordingFailsOnce(RecordingAgent):
    """Its store cannot take the first record (a full disk, say)."""

    async def record_unreadable(self, channel: str, event_id: str, problem: str, raw: str) -> None:
        if not self.set_aside:
            self.set_aside.append(("failed", event_id, problem, raw))
            raise OSError("disk full")
        await super().record_unreadable(channel, event_id, problem, raw)


async def test_a_poison_update_is_confirmed_only_once_recorded(fake: FakeTelegram) -> None:
    agent = RecordingFailsOnce()
    async with telegram(fake, agent, clock=FakeClock()):
        bad = fake.push_raw(poison())
        await until(lambda: len(agent.set_aside) == 2, "the second try")
        fake.dm(ALICE, "next")
        await wait_text(fake, ALICE.id, "echo: next")
        assert offset(fake) > bad["update_id"]  # the poll that brought "next" confirmed it
    polled = [u["update_id"] for c in fake.calls_of("getUpdates") for u in c.result or []]
    assert polled.count(bad["update_id"]) == 2  # fetched again: it was not confirmed
    assert [event_id for _, event_id, _, _ in agent.set_aside] == [str(bad["update_id"])] * 2


# ---- Telegram: the webhook ----------------------------------------------------------------------


async def test_webhook_records_a_poison_update_and_answers_200(fake: FakeTelegram) -> None:
    port = free_port()
    environ = ENV | {"TELEGRAM_WEBHOOK_SECRET": "s3cret"}
    hook = f"http://127.0.0.1:{port}/telegram/hook"
    agent = RecordingAgent()
    async with telegram(
        fake, agent, environ=environ, mode="webhook", webhook_url=hook, webhook_port=port
    ):
        bad = fake.push_raw(poison())
        await fake.wait_until(lambda: fake.deliveries, what="the webhook's answer")
        fake.dm(ALICE, "and now?")
        await wait_text(fake, ALICE.id, "echo: and now?")
    assert fake.deliveries[0] == (bad["update_id"], 200)  # Telegram need not send it again
    [(channel, event_id, _, raw)] = agent.set_aside
    assert (channel, event_id, json.loads(raw)) == ("telegram", str(bad["update_id"]), bad)


# ---- Telegram: the poll under its lease, on PostgreSQL ----------------------------------------


@asynccontextmanager
async def leased_pollers(
    fake: FakeTelegram, agent: Agent, count: int
) -> AsyncIterator[list[LeaseHolder]]:
    """`count` workers' Telegram channels, each polling only while it holds the lease."""
    channels = [TelegramChannel(config(fake), ENV) for _ in range(count)]
    holders = []
    for n, channel in enumerate(channels):
        [poll] = channel.singletons()
        await channel.start(agent)
        holders.append(LeaseHolder(agent.store, poll.name, f"w{n}", poll.run, ttl=6.0))
    tasks = [asyncio.create_task(holder.run()) for holder in holders]
    try:
        yield holders
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.stop()


async def test_a_poison_update_does_not_move_the_poll_lease_on_postgres(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    echo(fake_llm)
    caplog.set_level(logging.INFO)
    first = fake.dm(ALICE, "before")
    bad = fake.push_raw(poison())
    second = fake.dm(BOB, "after")
    async with (
        postgres_schema() as url,
        running_agent(fake_llm, tmp_path, store={"path": None, "url": url}) as agent,
        leased_pollers(fake, agent, 2) as holders,
    ):
        await wait_text(fake, ALICE.id, "re: before")
        await wait_text(fake, BOB.id, "re: after")
        await fake.wait_until(lambda: offset(fake) > second["update_id"], what="the offset")
        fake.dm(ALICE, "still there?")
        await wait_text(fake, ALICE.id, "re: still there?")
        assert await agent.store.seen("telegram", str(bad["update_id"]))
        await agent.wait_idle()
    assert sum(holder.tenures for holder in holders) == 1  # no bounce between workers
    [recorded] = unparsable_events(tmp_path / "events.jsonl")
    assert json.loads(recorded["raw"]) == bad
    assert first["update_id"] < bad["update_id"] < second["update_id"]
    assert not tracebacks(caplog)


# ---- Slack: the HTTP Events API -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"type": "event_callback", "event": {', "application/json"),
        (b'{"type": "event_callback", "text": "caf\xe9"}', "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b"payload=%7Bnot+json", "application/x-www-form-urlencoded"),
    ],
    ids=["not-json", "not-utf8", "not-an-object", "form-payload-not-json"],
)
async def test_a_signed_slack_request_bolt_cannot_read_gets_400_and_one_warning(
    slack: FakeSlack,
    fake_llm: FakeLLM,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    content_type: str,
) -> None:
    fake_llm.script(Reply(text="fine, thanks"))
    cfg = slack_config(slack, mode="http", http_port=0)
    async with (
        running_agent(fake_llm, tmp_path) as agent,
        slack_channel(slack, agent, cfg, slack_environ(slack)) as channel,
    ):
        status, _ = await slack.post_raw(body, content_type)
        assert status == 400
        envelope = await slack.dm("how are you?")
        assert envelope.http_status == 200
        await final_text(slack, "D1", None, "fine, thanks")
        await channel.settled()
    assert len(warnings_of(caplog, "channels.slack_http")) == 1
    assert not tracebacks(caplog)


async def test_an_unsigned_unreadable_slack_request_is_refused_as_unsigned(
    slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    cfg = slack_config(slack, mode="http", http_port=0)
    async with (
        running_agent(fake_llm, tmp_path) as agent,
        slack_channel(slack, agent, cfg),
    ):
        url, _ = slack.http_target or ("", "")
        slack.http_target = (url, "not-the-secret")
        status, _ = await slack.post_raw(b"\xff\xfe not json", "application/json")
    assert status == 401


# Slack's published example (docs: "Verifying requests from Slack"), the one slack_sdk's own
# tests use: our check over raw bytes must agree with it, and refuse what differs.
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SLACK_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
    b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
    b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands"
    b"%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
    b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
SLACK_HEADERS = {
    "X-Slack-Request-Timestamp": "1531420618",
    "X-Slack-Signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
}


def test_the_raw_signature_check_agrees_with_slacks_published_example() -> None:
    from channels.slack_http import signed

    assert signed(SLACK_BODY, SLACK_HEADERS, SLACK_SECRET, now=1531420618 + 60)
    assert not signed(SLACK_BODY + b"-", SLACK_HEADERS, SLACK_SECRET, now=1531420618)
    assert not signed(SLACK_BODY, SLACK_HEADERS, SLACK_SECRET, now=1531420618 + 301)
    assert not signed(SLACK_BODY, SLACK_HEADERS, SLACK_SECRET[:-1], now=1531420618)
