"""The whole of config.toml: core's sections (`core.config.CoreConfig`) plus one
`[channels.<name>]` section per chat platform, each validated by the settings model its
adapter keeps next to its code (`channels/<name>_config.py`).

A broken file is reported by core's loader, as a `ConfigError` naming the key and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from channels.discord_config import DiscordConfig
from channels.slack_config import SlackConfig
from channels.telegram_config import TelegramConfig
from core import config as core_config
from core.config import CoreConfig


class ChannelsConfig(BaseModel):
    """`[channels.*]`: one section per platform; a name no adapter knows is an error."""

    model_config = ConfigDict(extra="forbid")

    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    slack: SlackConfig = Field(default_factory=SlackConfig)
    discord: DiscordConfig = Field(default_factory=DiscordConfig)


class ParleyConfig(CoreConfig):
    """The whole of config.toml."""

    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)


def load_config(path: Path) -> ParleyConfig:
    """Read and validate config.toml at `path`.

    Raises:
        ConfigError: missing file, bad TOML or a schema violation, phrased for a human.
    """
    return core_config.load_config(path, ParleyConfig)


def parse_config(raw: dict[str, Any], *, source: Path | None = None) -> ParleyConfig:
    """Validate config.toml already parsed into `raw`; raises `ConfigError`."""
    return core_config.parse_config(raw, ParleyConfig, source=source)
