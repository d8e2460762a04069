""" "Stored before the platform acknowledges it", tested the hard way: a real `parley run`
against the fake Slack / Telegram, whose store cannot commit (another writer holds the
SQLite write lock, as a slow disk or a backup would), is killed with SIGKILL after the
message arrived and before it was stored. The platform must not have been told "received",
so it delivers the message again, and the restarted process answers it exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config, start_parley, telegram_run_config

ALICE = TgUser(111, "Alice", "alice")
TELEGRAM_TOKEN = "123456:TEST-token"
SIGNING_SECRET = "signing-secret"
WEBHOOK_SECRET = "hook-secret"


def _pong(request: RecordedRequest) -> Reply:
    return Reply(text=f"pong: {request.json['messages'][-1]['content']}")


class Parley:
    """A running `parley run`; its stderr is collected as it arrives."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        self.proc, self.err = proc, bytearray()
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._collect(proc.stderr))

    async def _collect(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self.err.extend(chunk)
            self._changed.set()

    async def until(self, condition: Callable[[], object], what: str, timeout: float = 30) -> None:
        """Wait until `condition()` holds, re-checking on output and every 50 ms."""
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 0.05)
        except TimeoutError:
            raise AssertionError(f"no {what} within {timeout:g} s\n{self.err.decode()}") from None

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self._reader

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 60)
        await self._reader
        return code


@asynccontextmanager
async def parley_run(config: Path, env: dict[str, str]) -> AsyncIterator[Parley]:
    proc = await start_parley("--config", str(config), "run", env=env, stdin=False)
    parley = Parley(proc)
    try:
        await parley.until(lambda: b"parley: ready" in parley.err, "start-up")
        yield parley
    finally:
        if proc.returncode is None:
            await parley.kill()


@contextlib.contextmanager
def store_locked(db: Path) -> Iterator[None]:
    """Another writer holds the store's write lock: Parley's commits wait (up to its busy
    timeout), reads go on."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def stored_runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT state, trigger FROM runs"))


def duplicates(events: Path) -> list[str]:
    if not events.exists():
        return []
    lines = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return [e["id"] for e in lines if e.get("event") == "channel.event.duplicate"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- Slack ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_slack_event_is_acknowledged_only_once_stored_and_survives_a_crash(
    fake_llm: FakeLLM, tmp_path: Path, mode: str
) -> None:
    fake_llm.responder = _pong
    port = free_port()
    db = tmp_path / "parley.db"
    async with FakeSlack() as slack:
        config = tmp_path / "config.toml"
        config.write_text(
            fake_llm_config(
                fake_llm.base_url,
                tmp_path,
                f"""
                [channels.slack]
                enabled = true
                mode = "{mode}"
                http_port = {port}
                base_url = "{slack.url}"
                allow_users = ["U1"]
                """,
            )
        )
        env = child_env(
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
        )
        if mode == "http":
            slack.http_target = (f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET)

        async with parley_run(config, env) as parley:
            if mode == "socket":
                await slack.connected()
            with store_locked(db):
                envelope = await slack.dm("remember me")  # HTTP: returns with the answer
                await parley.until(
                    lambda: (
                        envelope.envelope_id in slack.acks
                        or envelope.http_status == 200
                        or b"not stored" in parley.err
                    ),  # gave up waiting for the store: no ack
                    "the event handled",
                )
                assert envelope.envelope_id not in slack.acks
                assert envelope.http_status in (None, 503)
                await parley.kill()  # before the message was ever stored
        assert stored_runs(db) == []

        async with parley_run(config, env) as parley:
            if mode == "socket":
                await slack.connected(sessions=2)
            again = await slack.redeliver(envelope)  # Slack retries an unacknowledged event
            await slack.until(
                lambda: [m.text for m in slack.live_messages()] == ["pong: remember me"],
                what="the answer",
            )
            late = await slack.redeliver(again)  # and a retry that crossed our ack
            if mode == "socket":
                await slack.wait_ack(again)
                await slack.wait_ack(late)
            else:
                assert (again.http_status, late.http_status) == (200, 200)
            assert await parley.stop() == 0
    assert [m.text for m in slack.live_messages()] == ["pong: remember me"]
    assert stored_runs(db) == [("completed", "user")]
    assert len(fake_llm.requests) == 1


# ---- Telegram ---------------------------------------------------------------------------


def polled_offsets(telegram: FakeTelegram) -> list[int]:
    return [int(c.params.get("offset") or 0) for c in telegram.calls_of("getUpdates")]


def fetched(telegram: FakeTelegram, update_id: int) -> int:
    """How many getUpdates answers carried `update_id`."""
    return sum(
        u["update_id"] == update_id for c in telegram.calls_of("getUpdates") for u in c.result or []
    )


def telegram_config(tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, extra: str) -> Path:
    return telegram_run_config(tmp_path, fake_llm.base_url, telegram.url, ALICE.id, extra)


async def test_telegram_offset_passes_an_update_only_once_stored_and_survives_a_crash(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _pong
    db = tmp_path / "parley.db"
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        config = telegram_config(tmp_path, fake_llm, telegram, "")
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)

        async with parley_run(config, env) as parley:
            with store_locked(db):
                update = telegram.dm(ALICE, "remember me")
                uid = update["update_id"]
                await telegram.wait_until(lambda: fetched(telegram, uid) == 1, what="the fetch")
                polls = len(polled_offsets(telegram))
                # The next poll: it must not confirm the update, which is not stored yet.
                await telegram.wait_until(
                    lambda: len(polled_offsets(telegram)) > polls, timeout=20, what="the next poll"
                )
                assert polled_offsets(telegram)[polls] <= uid
                await parley.kill()
        assert stored_runs(db) == []

        async with parley_run(config, env) as parley:  # Telegram still has the update
            await telegram.wait_until(lambda: "pong: remember me" in telegram.texts(ALICE.id))
            await telegram.wait_until(
                lambda: max(polled_offsets(telegram)) > uid, timeout=30, what="confirm"
            )
            telegram.redeliver(update)  # and once more, as if the confirmation got lost
            await parley.until(lambda: duplicates(tmp_path / "events.jsonl"), "duplicate")
            assert await parley.stop() == 0
    assert telegram.texts(ALICE.id) == ["pong: remember me"]
    assert stored_runs(db) == [("completed", "user")]
    assert len(fake_llm.requests) == 1


async def test_telegram_webhook_answers_only_once_stored(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = _pong
    db = tmp_path / "parley.db"
    port = free_port()
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        extra = f"""
            mode = "webhook"
            webhook_url = "http://127.0.0.1:{port}/telegram"
            webhook_port = {port}
            """
        config = telegram_config(tmp_path, fake_llm, telegram, extra)
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN, TELEGRAM_WEBHOOK_SECRET=WEBHOOK_SECRET)

        async with parley_run(config, env) as parley:
            with store_locked(db):  # until the store gives up waiting for the lock
                update = telegram.dm(ALICE, "remember me")
                uid = update["update_id"]
                await telegram.wait_until(lambda: telegram.deliveries, what="the webhook answer")
                assert telegram.deliveries == [(uid, 500)]  # not stored: Telegram retries
                await parley.kill()
        assert stored_runs(db) == []

        async with parley_run(config, env) as parley:
            telegram.redeliver(update)
            await telegram.wait_until(lambda: "pong: remember me" in telegram.texts(ALICE.id))
            telegram.redeliver(update)
            await parley.until(lambda: duplicates(tmp_path / "events.jsonl"), "duplicate")
            assert await parley.stop() == 0
    assert telegram.deliveries == [(uid, 500), (uid, 200), (uid, 200)]
    assert telegram.texts(ALICE.id) == ["pong: remember me"]
    assert len(fake_llm.requests) == 1
