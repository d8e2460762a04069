"""Three `parley run` workers on one PostgreSQL schema (docs/scale-out.md, issue 15), the hard way:
real processes against a fake platform and the fake LLM, 300 messages across 50
conversations, one worker killed with SIGKILL midway while it runs turns.

- Slack, in HTTP Events API mode: the test posts the messages to the workers' HTTP
  endpoints round robin, as a load balancer would, and re-posts a delivery another
  worker's way when one fails (as Slack retries).
- Telegram, long polling: one worker polls (it holds the lease `telegram:poll:<bot id>`)
  and stores each update as a queued run, which any worker claims and answers. The poller
  is the one killed: another takes the lease over and fetches again what was not
  confirmed, and a live worker takes over the runs it was in the middle of.

Every message must end in exactly one outcome, answers come in each conversation's order,
and nothing is lost, the turns the killed worker was in the middle of included: the
rules, and their inherent exceptions, are tests.workerskit's.
"""

from __future__ import annotations

import asyncio
import re
from functools import partial
from pathlib import Path

import aiohttp

from core.store import Store, open_store
from tests.channels.test_stored_before_ack import Parley, free_port
from tests.fakes.llm import FakeLLM
from tests.fakes.slack import Envelope, FakeSlack
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config
from tests.store.conftest import postgres_schema
from tests.workerskit import (
    Posts,
    SlowPong,
    await_outcomes,
    check_outcomes,
    check_retractions,
    kill_when_running,
    shared_store,
    until_running,
    worker,
)

SIGNING_SECRET = "signing-secret"
CONVERSATIONS, PER_CONVERSATION = 50, 6
TELEGRAM_TOKEN = "123456:TEST-token"
POLL_LEASE = "telegram:poll:123456"
USERS = [TgUser(5000 + c, f"User {c}", f"user{c}") for c in range(CONVERSATIONS)]


def slack_config(
    tmp_path: Path, n: int, llm: FakeLLM, slack: FakeSlack, url: str, port: int
) -> Path:
    """Worker `n`'s config.toml: the shared store, its own HTTP port and state dir."""
    state = tmp_path / f"w{n}"
    state.mkdir()
    text = fake_llm_config(
        llm.base_url,
        state,
        f"""
        [channels.slack]
        enabled = true
        mode = "http"
        http_port = {port}
        base_url = "{slack.url}"
        allow_users = ["U1"]
        """,
    )
    config = state / "config.toml"
    config.write_text(shared_store(text, url))
    return config


class Balancer:
    """Posts each delivery to the next worker; a worker that fails it (down, dying, or
    answering an error) gets it no more: Slack retries, and this balancer sends the retry
    to the next worker."""

    def __init__(self, slack: FakeSlack, ports: list[int]) -> None:
        self.slack, self.ports = slack, ports
        self.down: set[int] = set()
        self.turn = 0

    async def post(self, envelope: Envelope) -> None:
        for attempt in range(len(self.ports) * 3):
            live = [p for p in self.ports if p not in self.down] or self.ports
            port = live[self.turn % len(live)]
            self.turn += 1
            envelope.retry_attempt = attempt
            self.slack.http_target = (f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET)
            try:
                status, _ = await self.slack.post_http(envelope)  # reads the target at once
            except (aiohttp.ClientError, OSError):
                self.down.add(port)
                continue
            if status == 200:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no worker took {envelope.payload['event']['text']!r}")


async def test_three_workers_answer_every_message_once_in_order_when_one_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = llm = SlowPong()
    ports = [free_port() for _ in range(3)]
    async with FakeSlack() as slack, postgres_schema() as url:
        env = child_env(
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
        )
        configs = [slack_config(tmp_path, n, fake_llm, slack, url, p) for n, p in enumerate(ports)]
        balancer = Balancer(slack, ports)

        def posts() -> list[tuple[str, str]]:
            return [(m.channel, m.text) for m in slack.live_messages()]

        async with (
            worker(configs[0], env) as first,
            worker(configs[1], env) as second,
            worker(configs[2], env) as third,
        ):
            sent: dict[str, str] = {}  # message text → its DM channel
            for n in range(PER_CONVERSATION):
                round_ = []
                if n == PER_CONVERSATION // 2:  # midway, with deliveries on their way to it
                    round_.append(kill_when_running(url, llm, lambda: second))
                for c in range(CONVERSATIONS):
                    text = f"c{c} m{n}"
                    sent[text] = f"D{c}"
                    payload = slack._event_payload(
                        slack._message(text, f"D{c}", "im", None, user="U1")
                    )
                    round_.append(balancer.post(Envelope(f"e{c}.{n}", "events_api", payload)))
                await asyncio.gather(*round_)
            found = await await_outcomes(url, posts, sent, "slack", (first, second, third))
            assert await first.stop() == 0
            assert await third.stop() == 0
    check_outcomes(found, posts, sent)


def telegram_config(tmp_path: Path, n: int, llm: FakeLLM, telegram: FakeTelegram, url: str) -> Path:
    """Worker `n`'s config.toml: the shared store, the fake Telegram (long polling), its
    own state dir; the 50 users may talk to the bot."""
    state = tmp_path / f"w{n}"
    state.mkdir()
    allowed = ", ".join(f'"{user.id}"' for user in USERS)
    text = fake_llm_config(
        llm.base_url,
        state,
        f"""
        [channels.telegram]
        enabled = true
        base_url = "{telegram.url}"
        allow_users = [{allowed}]
        drafts = false  # previews are edited messages: what a taker retracts
        """,
    )
    config = state / "config.toml"
    config.write_text(shared_store(text, url))
    return config


def telegram_posts(telegram: FakeTelegram) -> Posts:
    def posts() -> list[tuple[str, str]]:
        return [(str(user.id), text) for user in USERS for text in telegram.texts(user.id)]

    return posts


def holder(workers: list[Parley]) -> Parley | None:
    """The worker holding the poll lease: its last word on it was "taken" (a holder that
    misses a renewal under load loses it, so it may move while all are alive)."""
    for worker_ in workers:
        said = re.findall(rb"parley: lease " + POLL_LEASE.encode() + rb" (\w+)", worker_.err)
        if said and said[-1] == b"taken":
            return worker_
    return None


async def takes_in(telegram: FakeTelegram, round_: int, watch: Store) -> bool:
    """Whether the round's updates were fetched and the newest message stored is one of
    them (not all need be: each is confirmed only once stored)."""
    last = f"c{CONVERSATIONS - 1} m{round_}"
    fetched = any(
        update.get("message", {}).get("text") == last
        for call in telegram.calls_of("getUpdates")
        for update in call.result or ()
    )
    if not fetched:
        return False
    newest = await watch.runs(limit=1)
    return bool(newest) and (newest[0].text or "").endswith(f" m{round_}")


async def until_stored(url: str, count: int) -> None:
    """Until `count` messages are stored as runs (as a Slack delivery waits for its 200)."""
    async with await open_store(url) as store, asyncio.timeout(30):
        while len(await store.runs(limit=1000)) < count:
            await asyncio.sleep(0.05)


async def test_three_telegram_workers_answer_every_message_once_when_the_poller_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = llm = SlowPong()
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram, postgres_schema() as url:
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
        configs = [telegram_config(tmp_path, n, fake_llm, telegram, url) for n in range(3)]
        posts = telegram_posts(telegram)
        async with (
            worker(configs[0], env) as first,
            worker(configs[1], env) as second,
            worker(configs[2], env) as third,
        ):
            workers = [first, second, third]
            polling = partial(holder, workers)
            await first.until(polling, "a poller")
            sent: dict[str, str] = {}  # message text → its DM chat
            for n in range(PER_CONVERSATION):
                kill = []
                if n == PER_CONVERSATION // 2:
                    # Midway the poller dies while it takes this round in (mostly: some of
                    # it stored, none confirmed) and runs turns of earlier ones.
                    await until_running(url, llm, polling)  # so that it likely still is then
                    kill.append(
                        kill_when_running(url, llm, polling, partial(takes_in, telegram, n))
                    )
                for c, user in enumerate(USERS):
                    text = f"c{c} m{n}"
                    sent[text] = str(user.id)
                    telegram.dm(user, text)
                # After the kill a round is stored only once another worker polls.
                await asyncio.gather(until_stored(url, len(sent)), *kill)
            found = await await_outcomes(url, posts, sent, "telegram", workers)
            for survivor in workers:
                if survivor.proc.returncode is None:
                    assert await survivor.stop() == 0
    check_outcomes(found, posts, sent)
    check_retractions(telegram, [user.id for user in USERS])
