"""The chat platforms Parley talks on: one registry, `PLATFORMS`, maps a platform's name to
its settings model (the `[channels.<name>]` section) and a factory for its adapter.

`bot/config.py` validates the `[channels.*]` sections with it, `bot/run.py` builds the
enabled adapters and `bot/jobs.py` knows job targets by it. Like pydantic-ai's provider
registry, a platform's SDK is imported only when its adapter is built, so reading the
configuration imports none of them. Importing this module builds every platform's settings
model: what needs only the platforms' names takes them from `channels.PLATFORM_NAMES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from channels.base import Channel
from channels.discord_config import DiscordConfig
from channels.gate import AccessConfig
from channels.slack_config import SlackConfig
from channels.telegram_config import TelegramConfig
from core.chat import Deciders
from core.records import record

__all__ = ["PLATFORMS", "Platform", "target_examples"]

S = TypeVar("S", bound=AccessConfig)


@record(frozen=True, slots=True)
class Platform(Generic[S]):
    """One chat platform: its settings, how to build its adapter, what names it."""

    name: str
    """The channel type in conversation keys, job targets and `[channels.<name>]`."""
    settings: type[S]
    """The model of its `[channels.<name>]` section."""
    build: Callable[[S, Mapping[str, str], Deciders | None], Channel]
    """Makes the adapter from its settings, the environment (which holds its tokens) and
    who decides approvals (the roles, docs/governance.md#roles); imports the SDK."""
    target: str
    """What follows `<name>:` in a job's delivery target, e.g. `CHANNEL_ID`."""


def _slack(
    settings: SlackConfig, environ: Mapping[str, str], deciders: Deciders | None = None
) -> Channel:
    from channels.slack import SlackChannel  # slack_bolt, slack_sdk

    return SlackChannel(settings, environ, deciders=deciders)


def _telegram(
    settings: TelegramConfig, environ: Mapping[str, str], deciders: Deciders | None = None
) -> Channel:
    from channels.telegram import TelegramChannel  # python-telegram-bot

    return TelegramChannel(settings, environ, deciders=deciders)


def _discord(
    settings: DiscordConfig, environ: Mapping[str, str], deciders: Deciders | None = None
) -> Channel:
    from channels.discord import DiscordChannel  # discord.py

    return DiscordChannel(settings, environ, deciders=deciders)


PLATFORMS: dict[str, Platform[Any]] = {
    platform.name: platform
    for platform in (
        Platform("slack", SlackConfig, _slack, "CHANNEL_ID"),
        Platform("telegram", TelegramConfig, _telegram, "CHAT_ID"),
        Platform("discord", DiscordConfig, _discord, "CHANNEL_ID"),
    )
}
"""Every platform Parley has an adapter for, by name (in `PLATFORM_NAMES`' order, which
`tests/test_config_errors.py` checks)."""


def target_examples() -> str:
    """The job targets as a config fix names them: "`slack:CHANNEL_ID`, … or `…`"."""
    examples = [f"`{name}:{platform.target}`" for name, platform in PLATFORMS.items()]
    return ", ".join(examples[:-1]) + " or " + examples[-1]
