"""A broken `[channels.*]` section is reported as before the platform settings moved next to
their adapters: the same key, problem and fix. And core's configuration names no platform."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_jsonable_python

from bot.config import ParleyConfig, parse_config
from bot.wiring import secret_env_names
from channels import PLATFORM_NAMES, SDK_LOGGERS, SECRET_ENV_DEFAULTS
from channels.discord_config import DiscordConfig
from channels.platforms import PLATFORMS
from channels.slack_config import SlackConfig
from channels.telegram_config import TelegramConfig
from core.errors import ConfigError
from tests.process import REPO

BASE: dict[str, Any] = {
    "default_provider": "p",
    "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
}
SPELLING = "remove it, or check its spelling against the example config.toml"


@pytest.mark.parametrize(
    ("channels", "key", "problem", "fix"),
    [
        (
            {"slack": {"mode": "bogus"}},
            "channels.slack.mode",
            "Input should be 'socket' or 'http'",
            "use one of the values listed: 'socket' or 'http'",
        ),
        (
            {"telegram": {"webhook_port": 70000}},
            "channels.telegram.webhook_port",
            "Input should be less than or equal to 65535",
            "give a valid value (got 70000)",
        ),
        (
            {"discord": {"enabled": "maybe"}},
            "channels.discord.enabled",
            "Input should be a valid boolean, unable to interpret input",
            "give a valid value (got 'maybe')",
        ),
        (
            {"matrix": {"enabled": True}},
            "channels.matrix",
            "Extra inputs are not permitted",
            SPELLING,
        ),
        (
            {"slack": {"allow_user": ["U1"]}},
            "channels.slack.allow_user",
            "Extra inputs are not permitted",
            SPELLING,
        ),
        (
            {"telegram": {"max_bot_chain": 0}},
            "channels.telegram.max_bot_chain",
            "Input should be greater than or equal to 1",
            "give a valid value (got 0)",
        ),
        (
            {"discord": {"token_env": 5}},
            "channels.discord.token_env",
            "Input should be a valid string",
            "give a valid value (got 5)",
        ),
        (
            "not a table",
            "channels",
            "Input should be a valid dictionary or instance of ChannelsConfig",
            "give a valid value (got 'not a table')",
        ),
    ],
)
def test_a_broken_channel_section_names_the_key_and_the_fix(
    channels: object, key: str, problem: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE | {"channels": channels}, source=Path("/etc/parley/config.toml"))
    assert (caught.value.key, caught.value.problem, caught.value.fix) == (key, problem, fix)
    assert str(caught.value) == f"/etc/parley/config.toml: `{key}`: {problem}\n  fix: {fix}"


def test_each_platform_section_is_its_adapters_settings() -> None:
    config = parse_config(BASE | {"channels": {"slack": {"enabled": True, "mode": "http"}}})
    assert isinstance(config, ParleyConfig)
    assert isinstance(config.channels.slack, SlackConfig)
    assert (config.channels.slack.enabled, config.channels.slack.mode) == (True, "http")
    assert isinstance(config.channels.telegram, TelegramConfig)
    assert not config.channels.telegram.enabled
    assert isinstance(config.channels.discord, DiscordConfig)


def test_every_registered_platform_has_its_section_and_nothing_else_does() -> None:
    config = parse_config(BASE | {"channels": {"discord": {"enabled": True}}})
    assert list(config.channels.model_dump()) == list(PLATFORMS)
    for name, platform in PLATFORMS.items():
        assert type(config.channel(name)) is platform.settings
        assert config.channel(name).enabled == (name == "discord")


def test_reading_the_configuration_imports_no_platform_sdk() -> None:
    code = (
        "import sys\n"
        "import bot.config, bot.run\n"
        "print([m for m in ('discord', 'slack_bolt', 'slack_sdk', 'telegram') if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "[]"


def test_core_configuration_names_no_platform() -> None:
    core = Path(__file__).resolve().parents[1] / "core" / "config.py"
    text = core.read_text().lower()
    assert [name for name in ("slack", "telegram", "discord") if name in text] == []


def test_core_loader_without_a_schema_validates_the_whole_file() -> None:
    """`core.config.load_config(path)` (what the shared bench driver calls) validates the
    whole file once the application is imported, channels included."""
    code = (
        "from pathlib import Path\n"
        "import bot.app\n"
        "from core.config import load_config\n"
        "config = load_config(Path('config.toml'))\n"
        "print(type(config).__name__, config.channel('slack').enabled in (True, False))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ParleyConfig", "True"]


@pytest.mark.parametrize(
    ("section", "key", "problem", "fix"),
    [
        (
            {"roles": {"ops": {"members": ["matrix:U1"]}}},
            "roles",
            "`matrix:U1` in roles.ops.members names no platform Parley talks on",
            "start it with one of: slack:, telegram:, discord:",
        ),
        (
            {"budgets": {"per_user_day": -1}},
            "budgets.per_user_day",
            "Input should be greater than or equal to 0",
            "give a valid value (got -1)",
        ),
        (
            {"prices": 3},
            "prices",
            "Input should be a valid dictionary",
            "give a valid value (got 3)",
        ),
        ({"mcp": {"bogus": 1}}, "mcp.bogus", "Extra inputs are not permitted", SPELLING),
        (
            {"log": {"format": "xml"}},
            "log.format",
            "Input should be 'text' or 'json'",
            "use one of the values listed: 'text' or 'json'",
        ),
    ],
)
def test_a_broken_lazily_built_section_names_the_key_and_the_fix_at_load(
    section: dict[str, Any], key: str, problem: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE | section)
    assert (caught.value.key, caught.value.problem, caught.value.fix) == (key, problem, fix)


def test_a_file_without_a_section_builds_its_model_only_when_it_is_read() -> None:
    """A one-shot `parley chat -m` reads no role, MCP, budget, operator or platform setting:
    a file without them imports none of their models (docs/benchmarks.md)."""
    models = (
        "channels.platforms",
        "channels.gate",
        "core.roles",
        "core.mcp.config",
        "core.cost.settings",
        "bot.ops_config",
    )
    code = (
        "import sys\n"
        "from bot.config import parse_config\n"
        f"config = parse_config({BASE!r})\n"
        f"print(sorted(m for m in {models!r} if m in sys.modules))\n"
        "print(config.roles.terminal, config.mcp.servers, config.channel('slack').enabled)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.splitlines() == ["[]", "admin {} False"]


def test_an_unbuilt_section_names_the_variables_its_defaults_name() -> None:
    """The secrets to redact are known without building a section the file leaves out
    (`bot.wiring.secret_env_names`): each section's `default_env` is what its defaults
    name, and the platforms' names and loggers are the registry's."""

    def named(node: object) -> set[str]:
        if not isinstance(node, dict):
            return set()
        found = {v for k, v in node.items() if k.endswith("_env") and isinstance(v, str)}
        return found.union(*(named(v) for v in node.values()))

    config = parse_config(BASE)
    for key, section in ParleyConfig.sections().items():
        assert not config.has_section(key)
        assert set(section.default_env) == named(to_jsonable_python(getattr(config, key))), key
    assert secret_env_names(config) >= set(ParleyConfig.channels.default_env)
    for name, platform in PLATFORMS.items():
        defaults = platform.settings().model_dump()
        assert SECRET_ENV_DEFAULTS[name] == tuple(
            v for k, v in defaults.items() if k.endswith("_env")
        )
    assert PLATFORM_NAMES == tuple(PLATFORMS) == tuple(SDK_LOGGERS)
