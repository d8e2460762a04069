"""The chat platforms Parley talks on (their registry is `channels.platforms.PLATFORMS`).

This package's own module imports nothing: importing any adapter module runs it first, and
`parley chat -m` imports the terminal's (`channels.console_render`). What needs only the
platforms' names (the roles' validation, the log set-up) takes them from here without
building every platform's settings model (docs/benchmarks.md).
"""

from __future__ import annotations

SDK_LOGGERS: dict[str, tuple[str, ...]] = {
    "slack": ("slack_bolt", "slack_sdk"),
    "telegram": ("telegram",),
    "discord": ("discord",),
}
"""Each platform's SDK loggers, kept at warning unless the log level is debug
(`bot.cli`); `channels.platforms` checks that it names every registered platform."""

SECRET_ENV_DEFAULTS: dict[str, tuple[str, ...]] = {
    "slack": ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"),
    "telegram": ("TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET"),
    "discord": ("DISCORD_BOT_TOKEN",),
}
"""The variables each platform's `*_env` keys name by default: their values are redacted
(`bot.wiring.secret_env_names`) also when the file has no `[channels.*]` to build."""

PLATFORM_NAMES: tuple[str, ...] = tuple(SDK_LOGGERS)
"""The registered platforms' names, in the registry's order."""
