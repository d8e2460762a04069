"""The parts Parley is built of, each from its section of the configuration: the secrets
to redact, the store, the instruction places, the sandbox, the tool registry and the MCP
servers (`bot.app.App` composes them)."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from pydantic_core import to_jsonable_python

from bot.config import ParleyConfig
from channels import PLATFORM_NAMES
from core.config import StoreConfig
from core.errors import ConfigError
from core.instructions import Guidance, GuidancePlaces, load_guidance, under_root
from core.instructions.tool import LoadSkillTool
from core.redact import Redactor
from core.sandbox import Jail
from core.secrets import SECRETS
from core.tools.base import ToolRegistry
from core.tools.cli import CliTool
from core.tools.search import with_search

if TYPE_CHECKING:
    # loaded by what opens them: `parley chat -m` needs neither (docs/benchmarks.md)
    from core.agent.workers import SharedSettings
    from core.mcp.config import McpServerConfig
    from core.mcp.hub import McpHub
    from core.store import Store

log = logging.getLogger(__name__)


def secret_env_names(config: ParleyConfig) -> set[str]:
    """Every environment variable named by a `*_env` key (except model/base-URL overrides)."""
    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("_env") and key not in ("model_env", "base_url_env") and value:
                    # `headers_env` maps header names to variables; a trigger's
                    # `secret_env` may list several (while a secret is rotated)
                    if isinstance(value, dict):
                        names.update(map(str, value.values()))
                    elif isinstance(value, list):
                        names.update(map(str, value))
                    else:
                        names.add(str(value))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    tree = config.model_dump()
    for key, section in config.sections().items():  # as built, else as their defaults name
        if config.has_section(key):
            tree[key] = to_jsonable_python(getattr(config, key))
        else:
            names.update(section.default_env)
    walk(tree)
    return names


def mcp_servers(config: ParleyConfig) -> Mapping[str, McpServerConfig]:
    """`[mcp.servers]`; a file without `[mcp]` has none, and its model stays unbuilt."""
    return config.mcp.servers if config.has_section("mcp") else {}


def configured_secrets(
    config: ParleyConfig, environ: Mapping[str, str], registry: ToolRegistry
) -> list[tuple[str, str]]:
    """(name, value) of every secret the configuration gives Parley: the value of every
    `*_env` variable it names (API keys, bot and app tokens, the store password, MCP
    servers' `headers_env`), every variable an MCP server's `env` passes on, and every
    variable a CLI tool receives through tools.yaml `env:`."""
    names = secret_env_names(config)
    names |= {name for server in mcp_servers(config).values() for name in server.env}
    secrets = [(n, environ[n]) for n in sorted(names) if environ.get(n)]
    if config.store.url and (password := urlsplit(config.store.url).password):
        secrets.append(("store.url", unquote(password)))  # inline, though it should not be
    for name in registry.names():
        tool = registry.get(name)
        if isinstance(tool, CliTool):
            secrets += sorted(tool.env.items())
    return secrets


def _redactor(config: ParleyConfig, environ: Mapping[str, str], registry: ToolRegistry) -> Redactor:
    """Registers the configured secrets process-wide (`core.secrets.SECRETS`: every text
    that leaves the process is scrubbed of them) and masks them, with token shapes, in
    tool output."""
    secrets = configured_secrets(config, environ, registry)
    SECRETS.add_all(secrets)
    return Redactor(value for _, value in secrets)


def shared_settings(config: StoreConfig, channels: Collection[str]) -> SharedSettings | None:
    """Several workers may share a PostgreSQL store (docs/scale-out.md), answering the conversations
    of `channels` whichever of them took a message in; SQLite is one process's."""
    if config.backend() != "postgresql":
        return None
    from core.agent.workers import SharedSettings

    return SharedSettings(
        heartbeat=config.heartbeat_seconds,
        timeout=config.worker_timeout_seconds,
        sweep=config.sweep_seconds,
        max_runs=config.worker_max_runs,
        channels=frozenset(channels),
    )


async def open_configured_store(config: StoreConfig, environ: Mapping[str, str]) -> Store:
    """The store `[store]` names: its SQLite file, or its PostgreSQL URL with the password
    from `store.password_env`.

    Raises:
        ConfigError: see `core.store.open_store`.
    """
    from core.store import open_store

    return await open_store(config.target(), password=config.password(environ))


async def open_existing_store(config: StoreConfig, environ: Mapping[str, str]) -> Store | None:
    """`open_configured_store`, or None for a SQLite file that does not exist yet: the
    commands that only read it (`runs`, `usage`, `audit`) have nothing to show, and must
    not create it."""
    if config.backend() == "sqlite" and not config.resolved().exists():
        return None
    return await open_configured_store(config, environ)


def guidance_places(config: ParleyConfig) -> GuidancePlaces:
    """Where the instruction files and skills are: relative paths hang off config.toml's
    folder, as `tools_file` does (see `core.instructions.guidance` for why not a
    workspace)."""
    root = config.source.parent if config.source else Path.cwd()
    channels: dict[str, Path] = {}
    for name in PLATFORM_NAMES if config.has_section("channels") else ():  # else: none
        path = under_root(root, config.channel(name).instructions)
        if path is not None:
            channels[name] = path
    skills = (under_root(root, p) for p in config.skills.paths)
    return GuidancePlaces(
        workspace_file=under_root(root, config.instructions.file),
        library=under_root(root, config.instructions.library),
        channels=channels,
        skills=tuple(p for p in skills if p is not None),
        max_bytes=config.instructions.max_bytes,
    )


def config_files(config: ParleyConfig) -> list[Path]:
    """Every file Parley reads to decide what it tells the model or what tools may do:
    tools can read them and never change, replace or create them (see `Jail`) — the
    instruction files, the instruction library and the skill folders included."""
    files = [] if config.source is None else [config.source]
    base = config.source.parent if config.source else Path.cwd()
    if config.tools_path() is not None:  # protected when missing too: creating it adds tools
        # as written, not resolved: a symlink on the way must not be replaced either
        files.append(base / os.path.expanduser(config.tools.tools_file or ""))
    if servers := mcp_servers(config):  # the programs and scripts stdio MCP servers run
        from core.mcp.config import command_files

        for server in servers.values():
            files += command_files(server, base)
    return files + guidance_places(config).files()


def build_jail(config: ParleyConfig) -> Jail:
    """The kernel sandbox for this configuration; Parley's own data stays out of reach
    and its configuration read-only.

    Raises:
        ConfigError: see `Jail`.
    """
    store = config.store.resolved()
    protected = [store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")]
    events = config.store.resolved_events()
    if events is not None:
        protected.append(events)
    return Jail(config.tools, protected, config_files(config), guidance_places(config).skills)


def _jail_inputs(config: ParleyConfig) -> tuple[object, ...]:
    """What `build_jail` depends on: a reload with the same inputs keeps the jail."""
    from core.sandbox import config_entries

    store = config.store
    entries = [tuple(config_entries(f)) for f in config_files(config)]
    skills = [(p, p.exists()) for p in guidance_places(config).skills]
    return (config.tools.model_dump(), store.resolved(), store.resolved_events(), entries, skills)


LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "host.docker.internal"}


def build_registry(
    config: ParleyConfig,
    environ: Mapping[str, str],
    guidance: Guidance | None = None,
    *,
    stateless: bool = False,
) -> ToolRegistry:
    """Built-in tools plus the team's CLI tools from tools.yaml (if the file exists);
    `load_skill` when there are skills (in `guidance`, else read now), `web_fetch` unless
    turned off or `tools.network = false`.

    `stateless`: for a one-shot `parley chat -m`, which has no agent and no store, so
    without the tools that need them and could only refuse there: `delegate` (child runs
    are the agent's) and `remember`/`recall` (memory lives in the store)."""
    from core.agent.journal_tools import journal_tools
    from core.tools.ask import AskHumanTool
    from core.tools.builtin import builtin_tools
    from core.tools.cli import load_cli_tools

    registry = ToolRegistry([*builtin_tools(), AskHumanTool(), *journal_tools()])
    agent = config.agent
    if agent.max_depth > 0 and not stateless:
        from core.tools.delegate import DelegateTool

        registry.add(
            DelegateTool(agent.max_children, agent.max_depth, agent.hard_time_limit_seconds)
        )
    if config.memory.enabled and not stateless:
        from core.memory.tools import memory_tools

        for tool in memory_tools():
            registry.add(tool)
    if config.context.strategy == "focus":  # docs/context.md#the-focus-strategy
        from core.context.focus_tools import focus_tools

        for tool in focus_tools():
            registry.add(tool)
    if config.web_fetch.enabled and config.tools.network is not False:
        from core.tools.webfetch import WebFetchTool

        registry.add(WebFetchTool(config.web_fetch))
    guidance = guidance if guidance is not None else load_guidance(guidance_places(config))
    if guidance.skills:
        registry.add(LoadSkillTool(guidance))
    path = config.tools_path()
    if path is not None and path.exists():
        for tool in load_cli_tools(path, environ, reserved=registry.names()):
            registry.add(tool)
    return with_search(registry.tools(), None, config.tools.search_threshold)


def check_mcp(config: ParleyConfig, environ: Mapping[str, str]) -> None:
    """What start-up can say about `[mcp.servers]` without loading the SDK.

    Raises:
        ConfigError: the `mcp` package is missing, or a variable a server names is unset.
    """
    if not (servers := mcp_servers(config)):
        return
    if importlib.util.find_spec("mcp") is None:
        raise ConfigError(
            "mcp.servers",
            "MCP servers are configured, but the `mcp` package is not installed",
            "pip install 'parley[mcp]' (or remove the [mcp.servers.*] sections)",
        )
    from core.mcp.config import check_env

    for name, server in servers.items():
        check_env(name, server, environ)


def build_mcp(config: ParleyConfig, environ: Mapping[str, str], jail: Jail) -> McpHub | None:
    """The MCP servers `[mcp.servers]` names (not yet connected); None when there are
    none. The SDK is imported only here (`check_mcp` has vouched for the rest)."""
    if not mcp_servers(config):
        return None
    from core.mcp.hub import McpHub

    base = config.source.parent if config.source else Path.cwd()
    return McpHub(
        config.mcp.servers,
        jail=jail,
        sandbox=config.tools,
        environ=environ,
        base=base,
        state=config.store.resolved().parent,
    )
