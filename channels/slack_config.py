"""`[channels.slack]`: the Slack adapter's settings, on top of its access rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from channels.gate import AccessConfig


class SlackConfig(AccessConfig):
    """Tokens (by environment variable), Socket Mode or the HTTP Events API, receipts."""

    bot_token_env: str = "SLACK_BOT_TOKEN"
    app_token_env: str = Field("SLACK_APP_TOKEN", description="xapp- token for Socket Mode.")
    signing_secret_env: str = Field("SLACK_SIGNING_SECRET", description="HTTP mode only.")
    base_url: str = Field("https://slack.com/api/", description="Web API root.")
    mode: Literal["socket", "http"] = "socket"
    http_listen: str = "127.0.0.1"
    http_port: int = Field(3000, ge=0, le=65535)
    ack_reaction: str | None = Field("eyes", description="Reaction that acknowledges receipt.")
