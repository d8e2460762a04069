"""The whole of config.toml: core's sections (`core.config.CoreConfig`) plus one
`[channels.<name>]` section per registered platform (`channels.PLATFORMS`), each validated
by the settings model its adapter keeps next to its code (`channels/<name>_config.py`).

A broken file is reported by core's loader, as a `ConfigError` naming the key and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, create_model, field_validator

from bot.ops_config import LogConfig, ServerConfig, TelemetryConfig
from channels import PLATFORMS
from channels.gate import AccessConfig
from core import config as core_config
from core.config import CoreConfig, FixableError
from core.roles import RolesConfig

_SECTIONS: dict[str, Any] = {
    name: (platform.settings, Field(default_factory=platform.settings))
    for name, platform in PLATFORMS.items()
}
ChannelsConfig = create_model(
    "ChannelsConfig",
    __config__=ConfigDict(extra="forbid"),  # a platform no adapter knows is an error
    __doc__="`[channels.*]`: one section per registered platform.",
    **_SECTIONS,
)


class ParleyConfig(CoreConfig):
    """The whole of config.toml."""

    # Built from the registry, so the type checker cannot see its fields: use `channel()`.
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @field_validator("roles")
    @classmethod
    def _members_on_known_platforms(cls, roles: RolesConfig) -> RolesConfig:
        for name, role in roles.roles().items():
            for member in role.members:
                platform = member.split(":", 1)[0]
                if platform not in PLATFORMS:
                    raise FixableError(
                        f"`{member}` in roles.{name}.members names no platform Parley talks on",
                        f"start it with one of: {', '.join(f'{p}:' for p in PLATFORMS)}",
                    )
        return roles

    def channel(self, name: str) -> AccessConfig:
        """The settings of platform `name` (its `[channels.<name>]` section)."""
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
