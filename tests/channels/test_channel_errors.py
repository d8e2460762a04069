"""Each adapter's one mapping function turns its SDK's failures into the channel error tree
(`core.errors`): the real slack_sdk, python-telegram-bot and discord.py against the fakes,
answering 429, 5xx and 4xx."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator

import pytest
from telegram import Bot

from channels import discord_api
from channels.discord_api import discord_call, point_library_at
from channels.discord_config import DiscordConfig
from channels.slack import SlackChannel
from channels.slack_api import slack_call
from channels.slack_config import SlackConfig
from channels.telegram_api import telegram_call
from core.errors import (
    ChannelError,
    ChannelRateLimited,
    ChannelRefused,
    ChannelUnavailable,
    ParleyError,
)
from tests.fakes.discord import CHANNEL_ID, TOKEN, FakeDiscord
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord

TELEGRAM_TOKEN = "123456:TEST-token"
CHAT = -1001000


def test_the_channel_errors_are_one_subtree_of_parley_errors() -> None:
    for kind in (ChannelRateLimited, ChannelUnavailable, ChannelRefused):
        assert issubclass(kind, ChannelError)
    assert issubclass(ChannelError, ParleyError)
    assert ChannelRateLimited(2.5).retryable
    assert ChannelUnavailable("502").retryable
    refused = ChannelRefused("no", status=403, code="forbidden")
    assert (refused.retryable, refused.status, refused.code) == (False, 403, "forbidden")


# ---- Slack -----------------------------------------------------------------------------------


@pytest.fixture
async def slack() -> AsyncIterator[tuple[FakeSlack, SlackChannel]]:
    async with FakeSlack() as fake:
        env = {"SLACK_BOT_TOKEN": fake.bot_token, "SLACK_APP_TOKEN": fake.app_token}
        yield fake, SlackChannel(SlackConfig(enabled=True, base_url=fake.url), env)


async def test_slack_429_is_rate_limited_with_its_retry_after(
    slack: tuple[FakeSlack, SlackChannel],
) -> None:
    fake, channel = slack
    fake.fail_next("chat.postMessage", 429, retry_after=7)
    with pytest.raises(ChannelRateLimited) as caught:
        await slack_call(channel.client.chat_postMessage(channel="C1", text="hi"))
    assert caught.value.retry_after == 7.0


async def test_slack_5xx_is_unavailable(slack: tuple[FakeSlack, SlackChannel]) -> None:
    fake, channel = slack
    fake.fail_next("chat.update", 503)
    with pytest.raises(ChannelUnavailable):
        await slack_call(channel.client.chat_update(channel="C1", ts="1.0", text="hi"))


@pytest.mark.parametrize(("status", "code"), [(200, "channel_not_found"), (403, "not_allowed")])
async def test_slack_error_answers_are_refusals_with_slacks_code(
    slack: tuple[FakeSlack, SlackChannel], status: int, code: str
) -> None:
    fake, channel = slack
    fake.fail_next("chat.postMessage", status, error=code)
    with pytest.raises(ChannelRefused) as caught:
        await slack_call(channel.client.chat_postMessage(channel="C1", text="hi"))
    assert (caught.value.status, caught.value.code) == (status, code)


# ---- Telegram --------------------------------------------------------------------------------


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[FakeTelegram, Bot]]:
    async with FakeTelegram(token=TELEGRAM_TOKEN) as fake:
        fake.add_chat(CHAT)
        bot = Bot(TELEGRAM_TOKEN, base_url=f"{fake.url}/bot")
        await bot.initialize()
        try:
            yield fake, bot
        finally:
            await bot.shutdown()


async def test_telegram_429_is_rate_limited_with_its_retry_after(
    telegram: tuple[FakeTelegram, Bot],
) -> None:
    fake, bot = telegram
    fake.fail_next("sendMessage", 429, retry_after=3)
    with pytest.raises(ChannelRateLimited) as caught:
        await telegram_call(bot.send_message(CHAT, "hi"))
    assert caught.value.retry_after == 3.0


@pytest.mark.parametrize("status", [500, 502])
async def test_telegram_5xx_is_unavailable(telegram: tuple[FakeTelegram, Bot], status: int) -> None:
    fake, bot = telegram
    fake.fail_next("sendMessage", status)
    with pytest.raises(ChannelUnavailable):
        await telegram_call(bot.send_message(CHAT, "hi"))


@pytest.mark.parametrize(
    ("status", "description", "code"),
    [
        (400, "Bad Request: chat not found", "Chat not found"),
        (403, "Forbidden: bot was blocked by the user", "Forbidden: bot was blocked by the user"),
    ],
)
async def test_telegram_4xx_is_a_refusal_with_its_status_and_description(
    telegram: tuple[FakeTelegram, Bot], status: int, description: str, code: str
) -> None:
    fake, bot = telegram
    fake.fail_next("sendMessage", status, description=description)
    with pytest.raises(ChannelRefused) as caught:
        await telegram_call(bot.send_message(CHAT, "hi"))
    assert (caught.value.status, caught.value.code) == (status, code)


# ---- Discord ---------------------------------------------------------------------------------


@pytest.fixture
def _restore_discord_endpoints() -> Iterator[None]:
    with discord_api.library_endpoints_restored():
        yield


@pytest.fixture
async def discord_client(
    _restore_discord_endpoints: None,
) -> AsyncIterator[tuple[FakeDiscord, discord.Client]]:
    async with FakeDiscord() as fake:
        point_library_at(DiscordConfig(api_base_url=fake.url, gateway_url=fake.gateway_url))
        client = discord.Client(
            intents=discord.Intents.none(),
            max_ratelimit_timeout=discord_api.MAX_RATELIMIT_WAIT,  # as the adapter's client
        )
        await client.login(TOKEN)  # REST only: no gateway needed
        try:
            yield fake, client
        finally:
            await client.close()


async def test_discord_long_429_is_rate_limited_with_its_retry_after(
    discord_client: tuple[FakeDiscord, discord.Client],
) -> None:
    # discord.py sleeps through 429s shorter than its 30 s cap; a longer one is raised.
    fake, client = discord_client
    fake.fail_next("create_message", 429, retry_after=45.0)
    with pytest.raises(ChannelRateLimited) as caught:
        await discord_call(client.get_partial_messageable(int(CHANNEL_ID)).send("hi"))
    assert caught.value.retry_after == 45.0


async def test_discord_5xx_is_unavailable(
    discord_client: tuple[FakeDiscord, discord.Client],
) -> None:
    fake, client = discord_client
    fake.fail_next("create_message", 503)  # (discord.py retries 500/502/504 itself first)
    with pytest.raises(ChannelUnavailable):
        await discord_call(client.get_partial_messageable(int(CHANNEL_ID)).send("hi"))


@pytest.mark.parametrize("status", [403, 404])
async def test_discord_4xx_is_a_refusal_with_its_status(
    discord_client: tuple[FakeDiscord, discord.Client], status: int
) -> None:
    fake, client = discord_client
    fake.fail_next("create_message", status)
    with pytest.raises(ChannelRefused) as caught:
        await discord_call(client.get_partial_messageable(int(CHANNEL_ID)).send("hi"))
    assert caught.value.status == status
    assert caught.value.code is None  # the fake sends Discord's "code": 0 (no JSON code)
