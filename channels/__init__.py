"""The chat platforms Parley talks on: one registry, `PLATFORMS`, maps a platform's name to
its settings model (the `[channels.<name>]` section) and a factory for its adapter.

`bot/config.py` builds the `[channels.*]` sections from it, `bot/run.py` the enabled
adapters, `bot/jobs.py` knows job targets by it and `bot/cli.py` quietens the SDKs'
loggers with it. Like pydantic-ai's provider registry, a platform's SDK is imported only
when its adapter is built, so reading the configuration imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from channels.base import Channel
from channels.discord_config import DiscordConfig
from channels.gate import AccessConfig
from channels.slack_config import SlackConfig
from channels.telegram_config import TelegramConfig
from core.chat import Deciders

__all__ = ["PLATFORMS", "Platform", "target_examples"]

S = TypeVar("S", bound=AccessConfig)


@dataclass(frozen=True, slots=True)
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
    loggers: tuple[str, ...]
    """The SDK's loggers, kept at warning unless the log level is debug."""


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
        Platform("slack", SlackConfig, _slack, "CHANNEL_ID", ("slack_bolt", "slack_sdk")),
        Platform("telegram", TelegramConfig, _telegram, "CHAT_ID", ("telegram",)),
        Platform("discord", DiscordConfig, _discord, "CHANNEL_ID", ("discord",)),
    )
}
"""Every platform Parley has an adapter for, by name."""


def target_examples() -> str:
    """The job targets as a config fix names them: "`slack:CHANNEL_ID`, … or `…`"."""
    examples = [f"`{name}:{platform.target}`" for name, platform in PLATFORMS.items()]
    return ", ".join(examples[:-1]) + " or " + examples[-1]
