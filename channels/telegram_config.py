"""`[channels.telegram]`: the Telegram adapter's settings, on top of its access rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from channels.gate import AccessConfig
from core.errors import ConfigError


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


def webhook_secret(config: TelegramConfig, environ: Mapping[str, str]) -> str:
    """The webhook's secret token (Telegram sends it in `X-Telegram-Bot-Api-Secret-Token`).

    Raises:
        ConfigError: no `webhook_url`, or the variable does not hold a valid token.
    """
    if not config.webhook_url:
        raise ConfigError(
            "channels.telegram.webhook_url",
            "mode = 'webhook' needs the public URL Telegram posts updates to",
            "set webhook_url = 'https://bot.example.com/telegram', or use mode = 'polling'",
        )
    secret = environ.get(config.webhook_secret_env, "")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
        raise ConfigError(
            "channels.telegram.webhook_secret_env",
            f"the environment variable {config.webhook_secret_env} must hold 1-256 "
            "characters A-Z, a-z, 0-9, _ or -",
            f"export {config.webhook_secret_env}=$(openssl rand -hex 32)",
        )
    return secret
