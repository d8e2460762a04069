"""How a long or tabular answer arrives on each platform: the real adapters (PTB,
slack-bolt, discord.py) against the fake servers, a stand-in agent streaming a fixed
answer. The unit behaviour is in test_text.py and test_tables.py; this checks that every
platform's reply path goes through it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import pytest

from channels import discord_api
from channels.discord import DiscordChannel
from channels.discord_config import DiscordConfig
from channels.slack import SlackChannel
from channels.slack_config import SlackConfig
from channels.telegram import TelegramChannel
from channels.telegram_config import TelegramConfig
from core.chat import Inbound, Responder
from core.events import TextDelta
from tests.fakes.discord import DM_CHANNEL_ID, TOKEN, USER, FakeDiscord
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram, TgUser

ALICE = TgUser(111, "Alice", "alice")
TELEGRAM_TOKEN = "123456:TEST-token"
SLACK_SECRET = "signing-secret"

# The case: ~8,000 characters of numbered sentences, no newline.
PARAGRAPH = " ".join(f"Sentence number {i} says something about topic {i}." for i in range(1, 159))

TABLES = """Results:

| Name | Role | Score |
|:-----|:----:|------:|
| **Alice** | `eng` | 9.5 |
| Bob | [lead](https://ex.com/b) | 10 |

And the long one:

| Host | Purpose | Notes |
|------|---------|-------|
| db-1 | primary database | replicated to db-2 every five minutes |
| web-1 | front end | |

Done."""

ALIGNED = [
    "Name            Role            Score",
    "-----  -----------------------  -----",
    "Alice            eng              9.5",
    "Bob    lead (https://ex.com/b)     10",
]
BY_ROW = [
    "Host: db-1",
    "Purpose: primary database",
    "Notes: replicated to db-2 every five minutes",
    "",
    "Host: web-1",
    "Purpose: front end",
]


@dataclass
class AnsweringAgent:
    """Answers every message with `answer`, streamed in chunks, in a task of its own (as
    the real agent does: `submit` returns once the message is taken)."""

    answer: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        task = asyncio.get_running_loop().create_task(self._reply(responder))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _reply(self, responder: Responder) -> None:
        stream = responder.stream()
        for i in range(0, len(self.answer), 700):
            stream(TextDelta(self.answer[i : i + 700]))
            await asyncio.sleep(0)
        await stream.finish(self.answer)
        self.done.set()


@dataclass
class Platform:
    """One platform under test: `ask` sends a DM and waits for the whole answer; `shown`
    is what the user sees of each of the bot's messages, and `blocks` the text of the
    monospace blocks in them."""

    ask: Callable[[AnsweringAgent], AbstractAsyncContextManager[None]]
    shown: Callable[[], list[str]]
    blocks: Callable[[], list[str]]


def _fenced_blocks(texts: list[str]) -> list[str]:
    return [m[1] for text in texts for m in re.finditer(r"```\n(.*?)\n```", text, re.S)]


@asynccontextmanager
async def _telegram() -> AsyncIterator[Platform]:
    async with FakeTelegram(token=TELEGRAM_TOKEN) as fake:
        config = TelegramConfig(
            enabled=True,
            base_url=fake.url,
            allow_users=[str(ALICE.id)],
            edit_interval_seconds=0.05,
        )

        @asynccontextmanager
        async def ask(agent: AnsweringAgent) -> AsyncIterator[None]:
            channel = TelegramChannel(config, {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN})
            await channel.start(agent)
            try:
                fake.dm(ALICE, "tell me")
                await asyncio.wait_for(agent.done.wait(), 20)
                yield
            finally:
                await channel.stop()

        def blocks() -> list[str]:
            return [
                m["text"][e["offset"] : e["offset"] + e["length"]]
                for m in fake.bot_messages(ALICE.id)
                for e in m.get("entities", [])
                if e["type"] == "pre"
            ]

        yield Platform(ask, lambda: fake.texts(ALICE.id), blocks)


@asynccontextmanager
async def _slack() -> AsyncIterator[Platform]:
    async with FakeSlack() as fake:
        config = SlackConfig(
            enabled=True, base_url=fake.url, allow_users=["U1"], edit_interval_seconds=0.05
        )
        environ = {
            "SLACK_BOT_TOKEN": fake.bot_token,
            "SLACK_APP_TOKEN": fake.app_token,
            "SLACK_SIGNING_SECRET": SLACK_SECRET,
        }

        @asynccontextmanager
        async def ask(agent: AnsweringAgent) -> AsyncIterator[None]:
            channel = SlackChannel(config, environ)
            await channel.start(agent)
            try:
                if channel.config.mode == "socket":
                    await fake.connected()
                else:
                    fake.http_target = (channel.http_url, SLACK_SECRET)
                await fake.dm("tell me")
                await asyncio.wait_for(agent.done.wait(), 20)
                yield
            finally:
                await channel.stop()

        def shown() -> list[str]:
            return [m.text for m in fake.thread("D1", None)]

        yield Platform(ask, shown, lambda: _fenced_blocks(shown()))


@asynccontextmanager
async def _discord() -> AsyncIterator[Platform]:
    async with FakeDiscord() as fake:
        config = DiscordConfig(
            enabled=True,
            allow_users=[USER.id],
            api_base_url=fake.url,
            gateway_url=fake.gateway_url,
            edit_interval_seconds=0.05,
        )

        @asynccontextmanager
        async def ask(agent: AnsweringAgent) -> AsyncIterator[None]:
            with discord_api.library_endpoints_restored():
                channel = DiscordChannel(config, {"DISCORD_BOT_TOKEN": TOKEN})
                await channel.start(agent)
                try:
                    await fake.dm("tell me")
                    await asyncio.wait_for(agent.done.wait(), 20)
                    yield
                finally:
                    await channel.stop()

        def shown() -> list[str]:
            return fake.bot_texts(DM_CHANNEL_ID)

        yield Platform(ask, shown, lambda: _fenced_blocks(shown()))


PLATFORMS = {"telegram": _telegram, "slack": _slack, "discord": _discord}


@pytest.fixture(params=sorted(PLATFORMS))
async def platform(request: pytest.FixtureRequest) -> AsyncIterator[Platform]:
    async with PLATFORMS[request.param]() as platform:
        yield platform


async def test_long_paragraph_arrives_cut_at_sentence_ends(platform: Platform) -> None:
    assert 7900 < len(PARAGRAPH) < 8100
    async with platform.ask(AnsweringAgent(PARAGRAPH)):
        messages = platform.shown()
    assert len(messages) >= 2
    for message in messages:
        assert re.fullmatch(r"Sentence number \d+ .*topic \d+\.", message.strip()), message[-40:]
    assert " ".join(m.strip() for m in messages) == PARAGRAPH


async def test_tables_arrive_aligned_or_by_row(platform: Platform) -> None:
    async with platform.ask(AnsweringAgent(TABLES)):
        [message] = platform.shown()
    assert "|" not in message  # no raw rows, no `|---|` separator rows
    assert platform.blocks() == ["\n".join(ALIGNED)]
    plain = message.replace("*", "")  # Slack and Discord show the column names in bold
    assert "\n".join(BY_ROW) in plain
    assert plain.startswith("Results:\n")
    assert plain.endswith("\n\nDone.")
