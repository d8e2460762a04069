"""`[channels.discord]`: the Discord adapter's settings, on top of its access rules."""

from __future__ import annotations

from pydantic import Field

from channels.gate import AccessConfig


class DiscordConfig(AccessConfig):
    """The bot token (by environment variable), endpoints and the slash commands."""

    token_env: str = "DISCORD_BOT_TOKEN"
    api_base_url: str = Field("https://discord.com/api/v10", description="REST root.")
    gateway_url: str | None = Field(None, description="Gateway URL override (tests, proxies).")
    sync_commands: bool = Field(True, description="Register the slash commands at start.")
    shard_count: int = Field(
        1,
        ge=1,
        le=1024,
        description="Gateway shards (Discord requires one per 2,500 guilds). With several "
        "workers each shard is leased (`discord:shard:<n>`) and may sit on any worker.",
    )
    repost_final_over: int | None = Field(
        1000,
        ge=0,
        description="A final answer longer than this (characters) is posted as a new message "
        "(the channel shows it unread) and the preview removed; none: always edited in place.",
    )
