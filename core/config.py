"""The configuration schema (config.toml) and its loader.

Every problem is reported as a `ConfigError` that names the key, what is wrong and how
to fix it. Secrets never live in the file: `*_env` keys name environment variables.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.context import ContextSettings
from core.errors import ConfigError
from core.models import context_window
from core.providers.base import ProviderSettings
from core.tools.base import SandboxSettings

ProviderKind = Literal["openai_chat", "openai_responses", "anthropic"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderConfig(_Section):
    """One LLM endpoint."""

    kind: ProviderKind = Field(description="Wire format.", examples=["openai_chat"])
    model: str = Field(description="Model name sent to the API.", examples=["gpt-4o-mini"])
    model_env: str | None = Field(None, description="Env var that overrides `model` if set.")
    base_url: str = Field(description="API root.", examples=["https://api.openai.com/v1"])
    base_url_env: str | None = Field(None, description="Env var that overrides `base_url`.")
    api_key_env: str | None = Field(None, description="Env var holding the API key.")
    context_window: int | None = Field(None, gt=0, description="Tokens; else the catalog.")
    max_output_tokens: int = Field(4096, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    timeout_seconds: float = Field(120.0, gt=0, description="Read timeout per stream chunk.")
    max_retries: int = Field(3, ge=0, le=10)

    def settings(self, name: str, environ: Mapping[str, str]) -> ProviderSettings:
        """Resolve environment references into the settings a provider is built from."""
        model = environ.get(self.model_env or "") or self.model
        return ProviderSettings(
            name=name,
            kind=self.kind,
            base_url=(environ.get(self.base_url_env or "") or self.base_url),
            model=model,
            api_key=environ.get(self.api_key_env) if self.api_key_env else None,
            context_window=context_window(model, self.context_window),
            max_output_tokens=self.max_output_tokens,
            temperature=self.temperature,
            timeout=self.timeout_seconds,
            max_retries=self.max_retries,
        )


class AgentConfig(_Section):
    """Limits and behaviour of the tool loop."""

    system_prompt: str = Field(
        "You are Parley, a helpful assistant for a software team. Use tools when they help; "
        "be concise.",
        description="Instructions placed first in every conversation.",
    )
    max_iterations: int = Field(20, ge=1, le=500, examples=[20])
    cancel_grace_seconds: float = Field(1.0, ge=0, le=60)
    parallel_read_tools: bool = True
    approval_timeout_seconds: float = Field(300.0, gt=0)
    soft_time_limit_seconds: float = Field(
        900.0, gt=0, description="Then one last tool-less turn summarises what was done."
    )
    hard_time_limit_seconds: float = Field(1200.0, gt=0, description="Then the run is aborted.")
    loop_detection: bool = Field(True, description="Nudge, then stop, a model that repeats.")
    summary_provider: str | None = Field(
        None, description="Provider for compaction summaries (a cheap one); default: the same."
    )

    @model_validator(mode="after")
    def _limits_ordered(self) -> AgentConfig:
        if self.soft_time_limit_seconds > self.hard_time_limit_seconds:
            raise ValueError(
                "soft_time_limit_seconds must not exceed hard_time_limit_seconds "
                f"({self.soft_time_limit_seconds} > {self.hard_time_limit_seconds})"
            )
        return self


class ToolsConfig(SandboxSettings):
    """Sandbox settings plus where the team's CLI tools are defined."""

    tools_file: Path | None = Field(
        Path("tools.yaml"), description="CLI tools (relative to config.toml)."
    )


class ParleyConfig(_Section):
    """The whole of config.toml."""

    default_provider: str = Field(examples=["openai"])
    providers: dict[str, ProviderConfig]
    agent: AgentConfig = Field(default_factory=AgentConfig)
    context: ContextSettings = Field(default_factory=ContextSettings)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)

    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _providers_exist(self) -> ParleyConfig:
        known = ", ".join(sorted(self.providers)) or "none"
        for key, name in (
            ("default_provider", self.default_provider),
            ("agent.summary_provider", self.agent.summary_provider),
        ):
            if name is not None and name not in self.providers:
                raise ValueError(
                    f"{key} `{name}` is not a configured provider (configured: {known})"
                )
        return self

    def tools_path(self) -> Path | None:
        if self.tools.tools_file is None:
            return None
        base = self.source.parent if self.source else Path.cwd()
        return (base / os.path.expanduser(self.tools.tools_file)).resolve()


def load_config(path: Path) -> ParleyConfig:
    """Read and validate `path`.

    Raises:
        ConfigError: missing file, bad TOML or a schema violation, phrased for a human.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(
            "(file)",
            f"{path} does not exist",
            "pass --config PATH, set PARLEY_CONFIG, or run from the directory holding config.toml",
            source=str(path),
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            "(syntax)", f"not valid TOML: {exc}", "fix the syntax at that line", source=str(path)
        ) from exc
    return parse_config(raw, source=path)


def parse_config(raw: dict[str, Any], *, source: Path | None = None) -> ParleyConfig:
    try:
        config = ParleyConfig.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc, str(source or "config.toml")) from exc
    config.source = source
    return config


def _config_error(exc: ValidationError, source: str) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "missing":
        fix = f"add `{err['loc'][-1]} = …` (see the commented example config.toml)"
    elif kind == "extra_forbidden":
        fix = "remove it, or check its spelling against the example config.toml"
    elif kind == "value_error":
        fix = "change the value as the message says"
    elif kind.startswith("literal"):
        fix = f"use one of the values listed: {err.get('ctx', {}).get('expected', '')}"
    else:
        fix = f"give a valid value (got {err.get('input')!r})"
    problem = err["msg"].removeprefix("Value error, ")
    return ConfigError(key, problem, fix, source=source)
