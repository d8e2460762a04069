"""The whole of config.toml: core's sections (`core.config.CoreConfig`) plus one
`[channels.<name>]` section per registered platform (`channels.platforms.PLATFORMS`), each
validated by the settings model its adapter keeps next to its code
(`channels/<name>_config.py`), and the operator's `[server]`, `[log]` and `[telemetry]`.

Those are `core.sections.Section`s: a file without `[channels.*]` builds no platform's
settings model unless one is read (docs/benchmarks.md). A broken file is reported by
core's loader, as a `ConfigError` naming the key and the fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, create_model

from channels import PLATFORM_NAMES, SECRET_ENV_DEFAULTS
from core import config as core_config
from core.config import CoreConfig, FixableError
from core.sections import Section

if TYPE_CHECKING:
    from bot.ops_config import LogConfig, ServerConfig, TelemetryConfig
    from channels.gate import AccessConfig
    from core.roles import RolesConfig


@functools.cache
def channels_model() -> type[BaseModel]:
    """`[channels.*]`: one section per registered platform (built from the registry, so
    the type checker cannot see its fields: use `ParleyConfig.channel()`)."""
    from channels.platforms import PLATFORMS

    sections: dict[str, Any] = {
        name: (platform.settings, Field(default_factory=platform.settings))
        for name, platform in PLATFORMS.items()
    }
    return create_model(
        "ChannelsConfig",
        __config__=ConfigDict(extra="forbid"),  # a platform no adapter knows is an error
        __doc__="`[channels.*]`: one section per registered platform.",
        **sections,
    )


def _channels() -> Callable[[Any], BaseModel]:
    return channels_model().model_validate


def _roles() -> Callable[[Any], RolesConfig]:
    from core.roles import RolesConfig

    def validate(raw: Any) -> RolesConfig:
        roles = RolesConfig.model_validate(raw)
        for name, role in roles.roles().items():
            for member in role.members:
                platform = member.split(":", 1)[0]
                if platform not in PLATFORM_NAMES:
                    raise FixableError(
                        f"`{member}` in roles.{name}.members names no platform Parley talks on",
                        f"start it with one of: {', '.join(f'{p}:' for p in PLATFORM_NAMES)}",
                    )
        return roles

    return validate


def _server() -> Callable[[Any], ServerConfig]:
    from bot.ops_config import ServerConfig

    return ServerConfig.model_validate


def _log() -> Callable[[Any], LogConfig]:
    from bot.ops_config import LogConfig

    return LogConfig.model_validate


def _telemetry() -> Callable[[Any], TelemetryConfig]:
    from bot.ops_config import TelemetryConfig

    return TelemetryConfig.model_validate


class ParleyConfig(CoreConfig):
    """The whole of config.toml."""

    # `[channels.*]` is built from the registry, so the type checker cannot see its
    # fields: use `channel()`.
    channels: ClassVar[Section[BaseModel]] = Section(
        _channels, default_env=tuple(n for names in SECRET_ENV_DEFAULTS.values() for n in names)
    )
    roles: ClassVar[Section[RolesConfig]] = Section(_roles)  # members on known platforms
    server: ClassVar[Section[ServerConfig]] = Section(_server)
    log: ClassVar[Section[LogConfig]] = Section(_log)
    telemetry: ClassVar[Section[TelemetryConfig]] = Section(_telemetry)

    def channel(self, name: str) -> AccessConfig:
        """The settings of platform `name` (its `[channels.<name>]` section)."""
        from channels.gate import AccessConfig

        section = getattr(self.channels, name)
        assert isinstance(section, AccessConfig), name
        return section


core_config.register_whole_file(ParleyConfig)


def load_config(path: Path) -> ParleyConfig:
    """Read and validate config.toml at `path`.

    Raises:
        ConfigError: missing file, bad TOML or a schema violation, phrased for a human.
    """
    return core_config.load_config(path, ParleyConfig)


def parse_config(raw: dict[str, Any], *, source: Path | None = None) -> ParleyConfig:
    """Validate config.toml already parsed into `raw`; raises `ConfigError`."""
    return core_config.parse_config(raw, ParleyConfig, source=source)
