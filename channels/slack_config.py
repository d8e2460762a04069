"""`[channels.slack]`: the Slack adapter's settings, on top of its access rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from channels.gate import AccessConfig
from core.errors import ConfigError


class SuggestedPrompt(BaseModel):
    """One suggested prompt of an assistant thread: its button `title` and the `message`
    it sends."""

    model_config = ConfigDict(defer_build=True)  # built within `SlackConfig` (see `AccessConfig`)

    title: str = Field(min_length=1)
    message: str = Field(min_length=1)


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
    streaming: Literal["native", "edits"] = Field(
        "native",
        description="chat.startStream streaming (edits where Slack cannot), or edits only.",
    )
    thread_status: bool = Field(
        True,
        description="Show what the bot is doing under the thread (assistant.threads.setStatus).",
    )
    status_refresh_seconds: float = Field(
        90.0, gt=0, description="Re-send a lasting status this often (Slack drops it after ~2 min)."
    )
    suggested_prompts: list[SuggestedPrompt] = Field(
        default=[],
        max_length=4,
        description="Offered when someone opens an assistant thread (Slack shows up to 4).",
    )


def secret_of(environ: Mapping[str, str], var: str, key: str, what: str) -> str:
    """The secret in environment variable `var` (named by setting `key`), or a config
    error that says how to set it."""
    value = environ.get(var, "").strip()
    if not value:
        raise ConfigError(
            f"channels.slack.{key}",
            f"environment variable {var} is not set",
            f"export {var}={what} (or point `{key}` at the variable that holds it)",
        )
    return value


def tokens(config: SlackConfig, environ: Mapping[str, str]) -> tuple[str, str, str]:
    """The bot token, and the app token (Socket Mode) or the signing secret (HTTP mode);
    "" for the one the mode does not use.

    Raises:
        ConfigError: a variable the mode needs is unset (see `secret_of`).
    """
    bot = secret_of(environ, config.bot_token_env, "bot_token_env", "xoxb-…")
    if config.mode == "socket":
        return bot, secret_of(environ, config.app_token_env, "app_token_env", "xapp-…"), ""
    signing = "the signing secret"
    return bot, "", secret_of(environ, config.signing_secret_env, "signing_secret_env", signing)
