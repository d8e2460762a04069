"""The configuration schema (config.toml) and its loader, all but the chat platforms.

Core names no platform: each adapter owns its `[channels.<name>]` settings next to its
code, and `bot/config.py` composes the whole file (`ParleyConfig`) from `CoreConfig` and
those. Every problem is reported as a `ConfigError` that names the key, what is wrong and
how to fix it. Secrets never live in the file: `*_env` keys name environment variables.

The sections few runs read (`roles`, `mcp`, `prices`, `budgets`) are `core.sections.Section`s:
validated at load when the file has them, else built when first read (docs/benchmarks.md).
A package whose section is its own keeps its model next to its code, as `[store]` is
`core.store.settings.StoreConfig` (importable from here too).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar, overload

from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from core.context.settings import ContextSettings
from core.context.windows import context_window
from core.errors import ConfigError, FixableError
from core.instructions.settings import InstructionsConfig, SkillsConfig
from core.providers.base import ProviderSettings
from core.providers.failover import FailoverSettings
from core.sandbox import SandboxSettings
from core.sections import SECTION_CONFIG, Section, sections_of
from core.store.settings import StoreConfig
from core.tools.webfetch import WebFetchConfig
from core.triggers.config import TriggerConfig, TriggerName

if TYPE_CHECKING:
    from core.cost.settings import BudgetsConfig, ModelPrice
    from core.mcp.config import McpConfig
    from core.roles import RolesConfig

ProviderKind = Literal["openai_chat", "openai_responses", "anthropic"]
ConfigT = TypeVar("ConfigT", bound="CoreConfig")


class _Section(BaseModel):
    """A section of config.toml (`SECTION_CONFIG`)."""

    model_config = SECTION_CONFIG


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
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Concurrent streams to this endpoint (all kept alive); default: no cap, "
        "as every conversation may run its turn at once.",
    )
    fallbacks: list[str] = Field(
        default=[],
        description="Providers a turn goes on with, in order, when this one fails past its "
        "retries (docs/providers.md#failover).",
    )

    prompt_cache_key: bool | None = Field(
        None,
        description="OpenAI wire formats: send `prompt_cache_key` per conversation; default: "
        "only to api.openai.com (another server may reject a field it does not know).",
    )

    def settings(self, name: str, environ: Mapping[str, str]) -> ProviderSettings:
        """Resolve environment references into the settings a provider is built from."""
        model = environ.get(self.model_env or "") or self.model
        base_url = environ.get(self.base_url_env or "") or self.base_url
        return ProviderSettings(
            name=name,
            kind=self.kind,
            base_url=base_url,
            model=model,
            api_key=environ.get(self.api_key_env) if self.api_key_env else None,
            context_window=context_window(model, self.context_window),
            max_output_tokens=self.max_output_tokens,
            temperature=self.temperature,
            timeout=self.timeout_seconds,
            max_retries=self.max_retries,
            max_connections=self.max_connections,
            prompt_cache_key=(
                "api.openai.com" in base_url
                if self.prompt_cache_key is None
                else self.prompt_cache_key
            ),
        )


class AgentConfig(_Section):
    """Limits and behaviour of the tool loop."""

    system_prompt: str = Field(
        "You are Parley, a helpful assistant for a software team. Use tools when they help; "
        "be concise.",
        description="Instructions placed first in every conversation.",
    )
    max_iterations: int = Field(20, ge=1, le=500, examples=[20])
    max_queued: int = Field(
        20, ge=1, description="Messages that may wait per conversation; more are turned away."
    )
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
    max_children: int = Field(
        4, ge=1, le=32, description="Child runs one `delegate` call may start at once."
    )
    max_depth: int = Field(
        1,
        ge=0,
        le=4,
        description="How deep runs may delegate: 1 = only top-level runs; 0 = no `delegate` tool.",
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

    model_config = SECTION_CONFIG

    tools_file: Path | None = Field(
        Path("tools.yaml"), description="CLI tools (relative to config.toml)."
    )
    search_threshold: int = Field(
        30,
        ge=0,
        description="With more tools.yaml and MCP tools than this, a request carries the "
        "built-ins, `find_tools` and the tools it found; 0: every tool in every request.",
    )


class GoalsConfig(_Section):
    """Autonomous goals (`/goal create … --auto`)."""

    autonomous_enabled: bool = False
    autonomous_turn_delay_ms: int = Field(1000, ge=0)
    default_turns: int = Field(50, ge=1, le=1000)
    verify_interval: int = Field(3, ge=1, description="Ask the supervisor every N turns.")
    max_supervisor_fails: int = Field(3, ge=1)
    max_stuck_count: int = Field(3, ge=2, description="Identical outputs in a row = stuck.")
    supervisor_provider: str | None = Field(None, description="Default: the conversation's.")


class MemoryConfig(_Section):
    """Long-term memory (docs/delegation-memory.md): the `remember` and `recall` tools, and recall
    of the
    most relevant memories into the system message before each run."""

    enabled: bool = Field(True, description="Offer the `remember` and `recall` tools.")
    strategy: str = Field("lexical", description="How recall ranks: full-text search.")
    auto_recall: int = Field(
        0, ge=0, le=20, description="Memories put in the system message per run; 0: off."
    )
    min_score: float = Field(
        0.0, ge=0, lt=1, description="Matches scoring less (0..1) are not recalled."
    )

    @field_validator("strategy")
    @classmethod
    def _a_known_strategy(cls, strategy: str) -> str:
        if strategy != "lexical":
            raise FixableError(
                f"`{strategy}` recall is not available: only full-text (`lexical`) is; "
                "semantic recall needs an embedding model shipped in a package, and none "
                "is among Parley's dependencies",
                'set `strategy = "lexical"` (or leave it out)',
            )
        return strategy


class JobConfig(_Section):
    """One scheduled job (`[[jobs]]`)."""

    name: str
    schedule: str = Field(description="Cron expression: minute hour day month weekday.")
    timezone: str = "UTC"
    channel: str = Field(description="Target: `<channel type>:<channel or chat id>`.")
    prompt: str
    allow_tools: list[str] = Field(default=[])
    provider: str | None = None
    max_iterations: int | None = Field(None, ge=1, le=500)
    misfire_grace_seconds: int = Field(3600, ge=1)
    on_interrupt: Literal["rerun", "report"] = Field(
        "report",
        description="A fire whose worker died mid-run: `report` posts that it was "
        "interrupted; `rerun` goes on with it where that is safe (else reports).",
    )


def _mcp() -> Callable[[Any], McpConfig]:
    from core.mcp.config import McpConfig

    return McpConfig.model_validate


def _roles() -> Callable[[Any], RolesConfig]:
    from core.roles import RolesConfig

    return RolesConfig.model_validate


def _prices() -> Callable[[Any], dict[str, ModelPrice]]:
    from pydantic import TypeAdapter

    from core.cost.settings import ModelPrice

    return TypeAdapter(dict[str, ModelPrice]).validate_python


def _budgets() -> Callable[[Any], BudgetsConfig]:
    from core.cost.settings import BudgetsConfig

    return BudgetsConfig.model_validate


class CoreConfig(_Section):
    """config.toml without its `[channels.*]` sections, which `bot.config.ParleyConfig`
    adds from the platform adapters' own settings."""

    default_provider: str = Field(examples=["openai"])
    providers: dict[str, ProviderConfig]
    agent: AgentConfig = Field(default_factory=AgentConfig)
    context: ContextSettings = Field(default_factory=ContextSettings)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    goals: GoalsConfig = Field(default_factory=GoalsConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    skills: SkillsConfig = Field(default_factory=SkillsConfig)
    instructions: InstructionsConfig = Field(default_factory=InstructionsConfig)
    web_fetch: WebFetchConfig = Field(default_factory=WebFetchConfig)
    jobs: list[JobConfig] = Field(default=[])
    triggers: dict[TriggerName, TriggerConfig] = Field(default={})  # docs/triggers.md
    failover: FailoverSettings = Field(default_factory=FailoverSettings)
    # Built only when the file has them or when first read (`core.sections`).
    mcp: ClassVar[Section[McpConfig]] = Section(_mcp)
    roles: ClassVar[Section[RolesConfig]] = Section(_roles)
    prices: ClassVar[Section[dict[str, ModelPrice]]] = Section(_prices)
    """USD per million tokens, by model (docs/cost.md)."""
    budgets: ClassVar[Section[BudgetsConfig]] = Section(_budgets)

    source: Path | None = Field(None, exclude=True)
    _sections: dict[str, Any] = PrivateAttr(default_factory=dict)  # the `Section`s built
    _given: frozenset[str] = PrivateAttr(frozenset())  # the `Section`s the file has

    @model_validator(mode="wrap")
    @classmethod
    def _lazy_sections(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """The fields first, then each `Section` the file has (the rest wait until read)."""
        sections = sections_of(cls)
        given: dict[str, Any] = {}
        if isinstance(data, dict):
            given = {k: v for k, v in data.items() if k in sections}
            data = {k: v for k, v in data.items() if k not in sections}
        config = handler(data)
        for key, raw in given.items():
            config._sections[key] = sections[key].validate(raw)
        if given:
            config._given = frozenset(given)
        return config

    def has_section(self, key: str) -> bool:
        """Whether the file has the lazily built section `key`: a caller that can do
        without a section's defaults asks this first and so leaves it unbuilt."""
        return key in self._given

    @classmethod
    def sections(cls) -> dict[str, Section[Any]]:
        """The lazily built sections, by key (`core.sections`)."""
        return sections_of(cls)

    @model_validator(mode="after")
    def _providers_exist(self) -> CoreConfig:
        known = ", ".join(sorted(self.providers)) or "none"
        for key, name in (
            ("default_provider", self.default_provider),
            ("agent.summary_provider", self.agent.summary_provider),
            ("goals.supervisor_provider", self.goals.supervisor_provider),
            *((f"jobs.{i}.provider", job.provider) for i, job in enumerate(self.jobs)),
            *((f"triggers.{n}.provider", t.provider) for n, t in self.triggers.items()),
        ):
            if name is not None and name not in self.providers:
                raise ValueError(
                    f"{key} `{name}` is not a configured provider (configured: {known})"
                )
        for name, provider in self.providers.items():
            for fallback in provider.fallbacks:
                if fallback not in self.providers or fallback == name:
                    raise ValueError(
                        f"providers.{name}.fallbacks names `{fallback}`, which is not another "
                        f"configured provider (configured: {known})"
                    )
        return self

    def tools_path(self) -> Path | None:
        """The CLI tools file; None when `tools_file` is unset or empty."""
        if self.tools.tools_file is None or str(self.tools.tools_file) in ("", "."):
            return None
        base = self.source.parent if self.source else Path.cwd()
        return (base / os.path.expanduser(self.tools.tools_file)).resolve()


_whole_file: list[type[CoreConfig]] = [CoreConfig]


def register_whole_file(schema: type[CoreConfig]) -> None:
    """Make `schema` what `load_config(path)` validates against when no schema is given:
    the application's composition of the whole file (`bot.config.ParleyConfig` registers
    itself on import), since core cannot import it."""
    _whole_file[0] = schema


@overload
def load_config(path: Path) -> CoreConfig: ...


@overload
def load_config(path: Path, schema: type[ConfigT]) -> ConfigT: ...


def load_config(path: Path, schema: type[CoreConfig] | None = None) -> CoreConfig:
    """Read `path` and validate it against `schema` (by default the registered
    composition of the whole file, see `register_whole_file`).

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
    return parse_config(raw, schema or _whole_file[0], source=path)


def parse_config(
    raw: dict[str, Any], schema: type[ConfigT], *, source: Path | None = None
) -> ConfigT:
    """Validate already parsed TOML against `schema`; a violation is a `ConfigError`."""
    try:
        config = schema.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc, str(source) if source else None) from exc
    config.source = source
    return config


def _config_error(exc: ValidationError, source: str | None) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, ValueError) and isinstance(fix := getattr(cause, "fix", None), str):
        return ConfigError(key, str(cause), fix, source=source)
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


__all__ = [  # `StoreConfig` lives in `core.store.settings`, `FixableError` in `core.errors`
    "AgentConfig",
    "CoreConfig",
    "FixableError",
    "GoalsConfig",
    "JobConfig",
    "MemoryConfig",
    "ProviderConfig",
    "ProviderKind",
    "StoreConfig",
    "ToolsConfig",
    "load_config",
    "parse_config",
    "register_whole_file",
]
