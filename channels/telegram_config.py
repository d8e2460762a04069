"""`[channels.telegram]`: the Telegram adapter's settings, on top of its access rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from channels.gate import AccessConfig


class TelegramConfig(AccessConfig):
    """The bot token (by environment variable), the Bot API root, polling or a webhook."""

    token_env: str = "TELEGRAM_BOT_TOKEN"
    base_url: str = Field("https://api.telegram.org", description="Bot API root (no /bot).")
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = Field(None, description="Public URL Telegram posts updates to.")
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(8443, ge=0, le=65535)
    webhook_secret_env: str = "TELEGRAM_WEBHOOK_SECRET"
    drafts: bool = Field(
        True, description="Stream private-chat answers as a draft (sendMessageDraft)."
    )
