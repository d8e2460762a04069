"""The one retry helper for platform calls (channels/retry.py): 429s are waited out for
their `retry_after` on the injected clock, outages back off, refusals are not retried, and
each kind gives up after its limit. First against scripted failures, then through each
adapter's mapping against its fake server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from telegram import Bot

from channels.retry import ATTEMPTS, BACKOFF, MAX_RATE_LIMITS, call_with_retry
from channels.slack import SlackChannel
from channels.slack_api import slack_call
from channels.slack_config import SlackConfig
from channels.telegram_api import telegram_call
from core.errors import ChannelRateLimited, ChannelRefused, ChannelUnavailable
from tests.fakes.clock import FakeClock
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

TELEGRAM_TOKEN = "123456:TEST-token"
CHAT = -1001000


class Flaky:
    """A call that fails with the given errors, one per try, then answers "ok"."""

    def __init__(self, *failures: Callable[[], Exception]) -> None:
        self.failures = list(failures)
        self.tries = 0

    async def __call__(self) -> str:
        self.tries += 1
        if self.failures:
            raise self.failures.pop(0)()
        return "ok"


async def test_rate_limits_are_waited_out_for_their_retry_after_on_the_clock() -> None:
    clock = FakeClock()
    call = Flaky(lambda: ChannelRateLimited(7.0), lambda: ChannelRateLimited(30.0))
    assert await call_with_retry(call, clock=clock) == "ok"
    assert (call.tries, clock.sleeps) == (3, [7.0, 30.0])


async def test_outages_back_off_and_give_up_after_the_attempts() -> None:
    clock = FakeClock()
    call = Flaky(*[lambda: ChannelUnavailable("503")] * 99)
    with pytest.raises(ChannelUnavailable):
        await call_with_retry(call, clock=clock)
    assert call.tries == ATTEMPTS == 5
    assert clock.sleeps == list(BACKOFF) == [0.5, 1.0, 2.0, 4.0]


async def test_the_last_backoff_repeats_and_no_limit_means_until_it_works() -> None:
    clock = FakeClock()
    call = Flaky(*[lambda: ChannelUnavailable("down")] * 6)
    result = await call_with_retry(call, clock=clock, attempts=None, backoff=(1.0, 30.0))
    assert result == "ok"
    assert clock.sleeps == [1.0, 30.0, 30.0, 30.0, 30.0, 30.0]


async def test_rate_limits_give_up_after_their_own_limit() -> None:
    clock = FakeClock()
    call = Flaky(*[lambda: ChannelRateLimited(1.0)] * 99)
    with pytest.raises(ChannelRateLimited):
        await call_with_retry(call, clock=clock)
    assert call.tries == MAX_RATE_LIMITS + 1
    assert clock.sleeps == [1.0] * MAX_RATE_LIMITS


async def test_rate_limits_and_outages_are_counted_apart() -> None:
    clock = FakeClock()
    call = Flaky(
        *[lambda: ChannelUnavailable("503")] * 4,
        *[lambda: ChannelRateLimited(2.0)] * 3,
    )
    assert await call_with_retry(call, clock=clock) == "ok"
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 2.0, 2.0, 2.0]


async def test_a_refusal_is_raised_at_once() -> None:
    clock = FakeClock()
    call = Flaky(lambda: ChannelRefused("no", status=403, code="forbidden"))
    with pytest.raises(ChannelRefused):
        await call_with_retry(call, clock=clock)
    assert (call.tries, clock.sleeps) == (1, [])


# ---- through the adapters' mappings, against the fakes -----------------------------------


@pytest.fixture
async def slack() -> AsyncIterator[tuple[FakeSlack, SlackChannel]]:
    async with FakeSlack() as fake:
        env = {"SLACK_BOT_TOKEN": fake.bot_token, "SLACK_APP_TOKEN": fake.app_token}
        yield fake, SlackChannel(SlackConfig(enabled=True, base_url=fake.url), env)


async def test_slack_429s_are_waited_out_on_the_clock(
    slack: tuple[FakeSlack, SlackChannel],
) -> None:
    fake, channel = slack
    clock = FakeClock()
    fake.fail_next("chat.postMessage", 429, retry_after=7, times=2)
    post = channel.client.chat_postMessage
    response = await call_with_retry(lambda: slack_call(post(channel="C1", text="hi")), clock=clock)
    assert response["ok"]
    assert clock.sleeps == [7.0, 7.0]
    assert len(fake.calls_of("chat.postMessage")) == 3


async def test_slack_5xx_gives_up_after_the_attempts(
    slack: tuple[FakeSlack, SlackChannel],
) -> None:
    fake, channel = slack
    clock = FakeClock()
    fake.fail_next("chat.update", 503, times=99)
    update = channel.client.chat_update
    with pytest.raises(ChannelUnavailable):
        await call_with_retry(
            lambda: slack_call(update(channel="C1", ts="1.0", text="hi")), clock=clock
        )
    assert len(fake.calls_of("chat.update")) == ATTEMPTS
    assert clock.sleeps == list(BACKOFF)


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


async def test_telegram_429s_give_up_after_the_rate_limit_count(
    telegram: tuple[FakeTelegram, Bot],
) -> None:
    fake, bot = telegram
    clock = FakeClock()
    fake.fail_next("sendMessage", 429, retry_after=3, times=99)
    with pytest.raises(ChannelRateLimited):
        await call_with_retry(
            lambda: telegram_call(bot.send_message(CHAT, "hi")), clock=clock, rate_limits=2
        )
    assert clock.sleeps == [3.0, 3.0]
    assert [c.status for c in fake.calls if c.method == "sendMessage"] == [429] * 3


async def test_telegram_refusal_is_not_retried(telegram: tuple[FakeTelegram, Bot]) -> None:
    fake, bot = telegram
    clock = FakeClock()
    fake.fail_next("sendMessage", 400, description="Bad Request: chat not found")
    with pytest.raises(ChannelRefused):
        await call_with_retry(lambda: telegram_call(bot.send_message(CHAT, "hi")), clock=clock)
    assert clock.sleeps == []
    assert len([c for c in fake.calls if c.method == "sendMessage"]) == 1
