"""`open_thread` on each platform (docs/triggers.md#one-thread-per-key): the real SDKs
against the fake servers. The header lands in the channel, the returned thread is the one
the conversation key names, the key's responder posts into it, people's replies in it
reach the agent unmentioned with that key (Telegram: their `reply_to`), and a refusal is
a `DeliveryFailed`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from channels import discord_api
from channels.discord import DiscordChannel
from channels.discord_config import DiscordConfig
from channels.slack import SlackChannel
from channels.slack_config import SlackConfig
from channels.telegram import TelegramChannel
from channels.telegram_config import TelegramConfig
from channels.text import to_slack_mrkdwn
from core.chat import Inbound, Responder
from core.clock import Clock
from core.errors import DeliveryFailed
from tests.fakes.clock import FakeClock
from tests.fakes.discord import CHANNEL_ID, DM_CHANNEL_ID, TOKEN, USER, FakeDiscord
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import BOT, FakeTelegram, TgUser

HEADER = "[alertmanager] disk full on db-1"


class Recorder:
    """A stand-in agent: records what reaches it, answers nothing."""

    def __init__(self) -> None:
        self.inbounds: list[Inbound] = []
        self._changed = asyncio.Event()

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.inbounds.append(inbound)
        self._changed.set()
        return True

    async def record_unreadable(self, channel: str, event_id: str, problem: str, raw: str) -> None:
        raise AssertionError(f"update set aside: {problem}")

    async def next_inbound(self) -> Inbound:
        async with asyncio.timeout(10):
            while not self.inbounds:
                self._changed.clear()
                await self._changed.wait()
        return self.inbounds.pop(0)


# ---- Slack ----------------------------------------------------------------------------------


def slack_channel(fake: FakeSlack, clock: Clock | None = None) -> SlackChannel:
    """A Slack adapter (one worker's connection) to `fake`, admitting U1."""
    config = SlackConfig(enabled=True, base_url=fake.url, allow_users=["U1"])
    environ = {
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "SLACK_SIGNING_SECRET": "signing-secret",
    }
    return SlackChannel(config, environ, clock=clock)


@asynccontextmanager
async def slack(
    agent: Recorder, clock: Clock | None = None
) -> AsyncIterator[tuple[FakeSlack, SlackChannel]]:
    async with FakeSlack() as fake:
        channel = slack_channel(fake, clock)
        await channel.start(agent)
        try:
            await fake.connected()
            yield fake, channel
        finally:
            await channel.stop()


async def test_slack_header_opens_a_thread_that_posts_and_replies_share() -> None:
    agent = Recorder()
    async with slack(agent) as (fake, channel):
        ts = await channel.open_thread("C1", HEADER)
        [header] = fake.calls_of("chat.postMessage")
        assert header.params["channel"] == "C1"
        assert not header.params.get("thread_ts")  # the header is the thread's root
        assert [m.text for m in fake.thread("C1", None)] == [to_slack_mrkdwn(HEADER)]
        assert fake.thread("C1", None)[0].ts == ts

        await channel.responder(("slack", "C1", ts)).send("still full")
        [post] = fake.thread("C1", ts)
        assert post.text == "still full"

        await fake.channel_message("looking into it", thread_ts=ts)  # no mention
        reply = await agent.next_inbound()
    assert reply.key == ("slack", "C1", ts)
    assert reply.text == "looking into it"


async def test_slack_reply_under_the_bots_header_reaches_a_worker_that_did_not_post_it() -> None:
    """Another worker (a second connection of the same app) never saw the header posted;
    Slack's `parent_user_id` tells it the thread is under the bot's post."""
    poster, other = Recorder(), Recorder()
    async with slack(poster) as (fake, channel):
        ts = await channel.open_thread("C1", HEADER)
        await channel.stop()  # the poster is gone: only the other worker is connected
        second = slack_channel(fake)
        await second.start(other)
        try:
            await fake.connected()
            await fake.channel_message("is it still full?", thread_ts=ts)  # no mention
            reply = await other.next_inbound()
            await fake.channel_message("unrelated chatter")  # top level, no mention
            await fake.channel_message("a reply under a person's post", thread_ts="1.000001")
        finally:
            await second.stop()
    assert reply.key == ("slack", "C1", ts)
    assert other.inbounds == []  # the rest was not for the bot


async def test_slack_refused_header_raises_delivery_failed() -> None:
    async with slack(Recorder()) as (fake, channel):
        fake.not_in_channel.add("C9")
        with pytest.raises(DeliveryFailed, match="not_in_channel"):
            await channel.open_thread("C9", HEADER)
        assert fake.thread("C9", None) == []


async def test_slack_rate_limited_header_is_waited_out() -> None:
    clock = FakeClock()
    async with slack(Recorder(), clock) as (fake, channel):
        fake.fail_next("chat.postMessage", 429, retry_after=3)
        ts = await channel.open_thread("C1", HEADER)
        assert [m.ts for m in fake.thread("C1", None)] == [ts]
    assert 3.0 in clock.sleeps


# ---- Discord --------------------------------------------------------------------------------


@pytest.fixture
def _restore_discord_endpoints() -> Any:
    """The adapter points discord.py's class attributes at the fake; put them back."""
    with discord_api.library_endpoints_restored():
        yield


@asynccontextmanager
async def discord(agent: Recorder) -> AsyncIterator[tuple[FakeDiscord, DiscordChannel]]:
    async with FakeDiscord() as fake:
        config = DiscordConfig(
            enabled=True,
            allow_users=[USER.id],
            api_base_url=fake.url,
            gateway_url=fake.gateway_url,
        )
        channel = DiscordChannel(config, {"DISCORD_BOT_TOKEN": TOKEN})
        await channel.start(agent)
        try:
            yield fake, channel
        finally:
            await channel.stop()


@pytest.mark.usefixtures("_restore_discord_endpoints")
async def test_discord_header_gets_a_thread_that_posts_and_replies_share() -> None:
    agent = Recorder()
    async with discord(agent) as (fake, channel):
        thread = await channel.open_thread(CHANNEL_ID, HEADER)
        [header] = fake.calls_of("create_message")
        assert header.params["channel_id"] == CHANNEL_ID
        assert fake.bot_texts(CHANNEL_ID) == [HEADER]
        [started] = fake.calls_of("start_thread")
        header_id = fake.last_message(CHANNEL_ID)["id"]
        assert (started.params["channel_id"], started.params["message_id"]) == (
            CHANNEL_ID,
            header_id,
        )
        assert started.params["name"] == HEADER
        assert thread == header_id  # Discord gives a message's thread the message's id

        await channel.responder(("discord", CHANNEL_ID, thread)).send("still full")
        assert fake.bot_texts(thread) == ["still full"]
        assert fake.bot_texts(CHANNEL_ID) == [HEADER]

        await fake.thread_message("looking into it", thread_id=thread)  # no mention
        reply = await agent.next_inbound()
    assert reply.key == ("discord", CHANNEL_ID, thread)
    assert reply.text == "looking into it"


@pytest.mark.usefixtures("_restore_discord_endpoints")
async def test_discord_thread_is_named_after_the_header_within_100_characters() -> None:
    header = "[ci] " + "build failed on main after the merge of a very long branch name " * 3
    async with discord(Recorder()) as (fake, channel):
        thread = await channel.open_thread(CHANNEL_ID, header + "\nsecond line")
    [started] = fake.calls_of("start_thread")
    name = started.params["name"]
    assert len(name) == 100
    assert name.endswith("…")
    assert name.startswith("[ci] build failed on main")
    assert "\n" not in name
    assert fake.threads[thread]["name"] == name


@pytest.mark.usefixtures("_restore_discord_endpoints")
async def test_discord_refusals_raise_delivery_failed() -> None:
    async with discord(Recorder()) as (fake, channel):
        # A DM has no threads: the header is posted, the thread refused.
        with pytest.raises(DeliveryFailed, match="50024"):
            await channel.open_thread(DM_CHANNEL_ID, HEADER)
        assert fake.bot_texts(DM_CHANNEL_ID) == [HEADER]

        fake.fail_next("create_message", 403, times=2)  # the post, and its plain retry
        with pytest.raises(DeliveryFailed, match="403"):
            await channel.open_thread(CHANNEL_ID, HEADER)
        assert fake.bot_texts(CHANNEL_ID) == []
        assert len(fake.calls_of("start_thread")) == 1  # only the DM's


# ---- Telegram -------------------------------------------------------------------------------

ALICE = TgUser(111, "Alice", "alice")
GROUP = -1001000
FORUM = -1002000
TELEGRAM_TOKEN = "123456:TEST-token"


@asynccontextmanager
async def telegram(agent: Recorder) -> AsyncIterator[tuple[FakeTelegram, TelegramChannel]]:
    async with FakeTelegram(token=TELEGRAM_TOKEN) as fake:
        config = TelegramConfig(
            enabled=True, base_url=fake.url, allow_users=[str(ALICE.id)], drafts=False
        )
        channel = TelegramChannel(config, {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN})
        await channel.start(agent)
        try:
            yield fake, channel
        finally:
            await channel.stop()


async def test_telegram_threads_posts_reply_to_the_header() -> None:
    agent = Recorder()
    async with telegram(agent) as (fake, channel):
        fake.add_chat(GROUP)
        thread = await channel.open_thread(str(GROUP), HEADER)
        [header] = fake.bot_messages(GROUP)
        assert header["text"] == HEADER
        assert "reply_to_message" not in header
        assert thread == f"r{header['message_id']}"

        await channel.responder(("telegram", str(GROUP), thread)).send("still full")
        [_, post] = fake.calls_of("sendMessage")
        assert post.params["chat_id"] == GROUP
        assert post.params["reply_parameters"]["message_id"] == header["message_id"]
        assert "message_thread_id" not in post.params

        # A reply to the header needs no mention; it says what it replies to.
        fake.group_message(GROUP, ALICE, "looking into it", reply_to=header["message_id"])
        reply = await agent.next_inbound()
    assert reply.key == ("telegram", str(GROUP), "")
    assert reply.reply_to == str(header["message_id"])
    assert reply.text == "looking into it"


async def test_telegram_refused_header_raises_delivery_failed() -> None:
    async with telegram(Recorder()) as (fake, channel):
        with pytest.raises(DeliveryFailed, match="Chat not found"):
            await channel.open_thread("-1009999", HEADER)  # a chat the bot is not in
        assert not fake.bot_messages(-1009999)
        with pytest.raises(DeliveryFailed, match="not a Telegram chat id"):
            await channel.open_thread("general", HEADER)


def _message(
    chat: dict[str, Any], message_id: int, text: str, sender: TgUser = ALICE, **extra: Any
) -> dict[str, Any]:
    """A message's JSON as the Bot API sends it."""
    when = int(time.time())
    data = {"message_id": message_id, "date": when, "chat": chat, "from": sender.to_dict()}
    return data | {"text": text} | extra


async def test_telegram_reply_says_which_message_it_replies_to() -> None:
    agent = Recorder()
    group = {"id": GROUP, "type": "supergroup", "title": "Team"}
    forum = {"id": FORUM, "type": "supergroup", "title": "Ops", "is_forum": True}
    async with telegram(agent) as (fake, _):
        header = _message(group, 77, HEADER, BOT)
        fake.push_raw(
            {"update_id": 1, "message": _message(group, 90, "on it", reply_to_message=header)}
        )
        reply = await agent.next_inbound()
        # In a forum topic every message replies to the topic's first one: no reply_to.
        root = _message(forum, 5, "topic started", BOT)
        in_topic = _message(
            forum,
            91,
            "@parley_bot status?",
            message_thread_id=5,
            is_topic_message=True,
            reply_to_message=root,
            entities=[{"type": "mention", "offset": 0, "length": 11}],
        )
        fake.push_raw({"update_id": 2, "message": in_topic})
        topic_message = await agent.next_inbound()
    assert (reply.reply_to, reply.thread_id) == ("77", "")
    assert (topic_message.reply_to, topic_message.thread_id) == ("", "5")
