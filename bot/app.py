"""Builds Parley's parts from the configuration."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from bot.config import ParleyConfig
from channels import PLATFORMS
from core.agent.conversation import Conversation
from core.agent.journal import JournalBox
from core.chat import ConversationKey, Responder
from core.config import StoreConfig
from core.context.manager import ContextManager
from core.context.summarize import provider_summarizer
from core.context.tokens import TokenCounter
from core.errors import ConfigError
from core.instructions import Guidance, GuidancePlaces, load_guidance, signature, under_root
from core.instructions.tool import LoadSkillTool
from core.loop import Guards, LoopConfig
from core.mcp.config import check_env, command_files
from core.providers import Provider, build_provider
from core.providers.base import ProviderSettings
from core.redact import Redactor
from core.resilience import LoopDetector, TimeLimits
from core.secrets import SECRETS
from core.tools.base import ToolContext, ToolRegistry
from core.tools.cli import CliTool
from core.tools.executor import ToolExecutor
from core.tools.jail import Jail
from core.tools.landlock import make_undumpable
from core.tools.policy import ToolPolicy
from core.tools.reaper import REAPER
from core.tools.search import with_search
from core.tools.site import site_for

if TYPE_CHECKING:
    # The durable agent and its store are loaded by what opens them (`open_agent`): the
    # one-shot `parley chat -m` uses neither (docs/benchmarks.md).
    from core.agent import Agent
    from core.agent.workers import SharedSettings
    from core.mcp.hub import McpHub
    from core.memory.service import Memory
    from core.store import Store

log = logging.getLogger(__name__)

ReloadHook = Callable[[ParleyConfig, ParleyConfig], None]
"""Called as `hook(old, new)` after each successful reload (SIGHUP or a watched file),
between turns, before any conversation is built from `new`."""


def secret_env_names(config: ParleyConfig) -> set[str]:
    """Every environment variable named by a `*_env` key (except model/base-URL overrides)."""
    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key.endswith("_env") and key not in ("model_env", "base_url_env") and value:
                    # `headers_env` maps header names to variables
                    names.update(
                        map(str, value.values()) if isinstance(value, dict) else [str(value)]
                    )
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(config.model_dump())
    return names


def configured_secrets(
    config: ParleyConfig, environ: Mapping[str, str], registry: ToolRegistry
) -> list[tuple[str, str]]:
    """(name, value) of every secret the configuration gives Parley: the value of every
    `*_env` variable it names (API keys, bot and app tokens, the store password, MCP
    servers' `headers_env`), every variable an MCP server's `env` passes on, and every
    variable a CLI tool receives through tools.yaml `env:`."""
    names = secret_env_names(config)
    names |= {name for server in config.mcp.servers.values() for name in server.env}
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


def guidance_places(config: ParleyConfig) -> GuidancePlaces:
    """Where the instruction files and skills are: relative paths hang off config.toml's
    folder, as `tools_file` does (see `core.instructions.guidance` for why not a
    workspace)."""
    root = config.source.parent if config.source else Path.cwd()
    channels: dict[str, Path] = {}
    for name in PLATFORMS:
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
    if config.mcp.servers:  # the programs and scripts stdio MCP servers run
        for server in config.mcp.servers.values():
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
    from core.tools.roots import config_entries

    store = config.store
    entries = [tuple(config_entries(f)) for f in config_files(config)]
    skills = [(p, p.exists()) for p in guidance_places(config).skills]
    return (config.tools.model_dump(), store.resolved(), store.resolved_events(), entries, skills)


LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "host.docker.internal"}


def build_registry(
    config: ParleyConfig, environ: Mapping[str, str], guidance: Guidance | None = None
) -> ToolRegistry:
    """Built-in tools plus the team's CLI tools from tools.yaml (if the file exists);
    `load_skill` when there are skills (in `guidance`, else read now), `web_fetch` unless
    turned off or `tools.network = false`."""
    from core.agent.journal_tools import journal_tools
    from core.memory.tools import memory_tools
    from core.tools.ask import AskHumanTool
    from core.tools.builtin import builtin_tools
    from core.tools.cli import load_cli_tools
    from core.tools.delegate import DelegateTool

    registry = ToolRegistry([*builtin_tools(), AskHumanTool(), *journal_tools()])
    agent = config.agent
    if agent.max_depth > 0:
        registry.add(
            DelegateTool(agent.max_children, agent.max_depth, agent.hard_time_limit_seconds)
        )
    if config.memory.enabled:
        for tool in memory_tools():
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
    if not config.mcp.servers:
        return
    if importlib.util.find_spec("mcp") is None:
        raise ConfigError(
            "mcp.servers",
            "MCP servers are configured, but the `mcp` package is not installed",
            "pip install 'parley[mcp]' (or remove the [mcp.servers.*] sections)",
        )
    for name, server in config.mcp.servers.items():
        check_env(name, server, environ)


def build_mcp(config: ParleyConfig, environ: Mapping[str, str], jail: Jail) -> McpHub | None:
    """The MCP servers `[mcp.servers]` names (not yet connected); None when there are
    none. The SDK is imported only here (`check_mcp` has vouched for the rest)."""
    if not config.mcp.servers:
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


@dataclass(slots=True)
class App:
    """Everything built once per process from config."""

    config: ParleyConfig
    environ: Mapping[str, str]
    registry: ToolRegistry
    providers: dict[str, Provider] = field(default_factory=dict)
    counter: TokenCounter = field(default_factory=TokenCounter)
    fallback_provider: str | None = None  # used when the configured default is unusable
    redactor: Redactor = field(init=False)
    jail: Jail = field(init=False)
    generation: int = 0  # bumped by each successful reload
    retired: list[Provider] = field(default_factory=list)  # still used by running turns
    retired_jails: list[Jail] = field(default_factory=list)
    memory: Memory | None = None  # long-term memory, once the agent's store is open
    guidance: Guidance = field(init=False)  # instruction files and skills, as last read
    # Called after every reload (`ReloadHook`): e.g. to restart what a changed section runs.
    reload_hooks: list[ReloadHook] = field(default_factory=list)
    # More files whose change makes `refresh` reload (e.g. files a section names).
    watched: list[Callable[[ParleyConfig], list[Path]]] = field(default_factory=list)
    _stamps: tuple[object, ...] = ()
    _watch: tuple[list[Path], list[Path]] = field(default_factory=lambda: ([], []))
    _watch_of: ParleyConfig | None = None  # the configuration `_watch` was worked out for
    mcp: McpHub | None = field(init=False, default=None)  # connected by `open_agent`
    _base: ToolRegistry = field(init=False)  # the registry without MCP tools
    _tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _mcp_started: bool = False  # `start_mcp` ran: reloads reconfigure the servers

    def __post_init__(self) -> None:
        # No tool (and no other process of this user) may read our memory or environment.
        make_undumpable()
        self.redactor = _redactor(self.config, self.environ, self.registry)
        self.jail = build_jail(self.config)
        self._stamps = self._signature(self.config)
        tool = self.registry.get("load_skill")
        if isinstance(tool, LoadSkillTool):  # the registry's skills are the conversations'
            self.guidance = tool.guidance
        else:
            self.guidance = load_guidance(guidance_places(self.config))
            if self.guidance.skills:
                self.registry.add(LoadSkillTool(self.guidance))
        self._base = self.registry
        check_mcp(self.config, self.environ)  # the hub itself waits for `start_mcp`

    def _compose(self) -> None:
        """The registry: the configured tools plus what the MCP servers offer now."""
        extra = self.mcp.tools() if self.mcp is not None else []
        refused = self.mcp.refused if self.mcp is not None else None
        threshold = self.config.tools.search_threshold
        self.registry = with_search([*self._base.tools(), *extra], refused, threshold)

    def _tools_changed(self) -> None:
        """An MCP server's tools changed: conversations take the new registry before
        their next turn (a running turn keeps its tools)."""
        self._compose()
        self.generation += 1

    async def start_mcp(self) -> None:
        """Connect to the MCP servers (each within its connect timeout) and add their
        tools to the registry; a server that fails keeps trying in the background."""
        self._mcp_started = True
        if self.mcp is None:
            self.mcp = build_mcp(self.config, self.environ, self.jail)
        if self.mcp is not None:
            self.mcp.on_change = self._tools_changed
            await self.mcp.start()
            self._compose()

    async def stop_mcp(self) -> None:
        """Stop the MCP servers (their processes end) and any reconfiguration."""
        for task in list(self._tasks):
            task.cancel()
        if self.mcp is not None:
            await self.mcp.stop()

    def tool_status(self) -> list[str]:
        """Lines for `/status` about tool sources that can fail: the MCP servers."""
        return [self.mcp.describe()] if self.mcp is not None else []

    def _spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` in the background (an MCP reconfiguration), owned and logged."""

        async def run() -> None:
            await work()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.error("MCP reconfiguration failed", exc_info=finished.exception())

        task.add_done_callback(done)

    def settings(self, name: str) -> ProviderSettings:
        return self.config.providers[name].settings(name, self.environ)

    def provider(self, name: str) -> Provider:
        if name not in self.providers:
            self.providers[name] = build_provider(self.settings(name))
        return self.providers[name]

    def provider_problem(self, name: str, *, probe: bool = True) -> str | None:
        """Why provider `name` cannot be used right now, or None."""
        cfg, settings = self.config.providers[name], self.settings(name)
        url = urlsplit(settings.base_url)
        host = url.hostname or ""
        if cfg.api_key_env and not settings.api_key and host not in LOCAL_HOSTS:
            return f"{cfg.api_key_env} is not set"
        if not probe:
            return None
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError as exc:
            return f"cannot reach {settings.base_url} ({exc.strerror or exc})"
        return None

    def choose_provider(self, wanted: str | None = None) -> tuple[str | None, dict[str, str]]:
        """The wanted (or default) provider if usable, else the first usable one."""
        first = wanted or self.config.default_provider
        order = [first, *(n for n in self.config.providers if n != first)]
        problems: dict[str, str] = {}
        for name in order:
            problem = self.provider_problem(name)
            if problem is None:
                return name, problems
            problems[name] = problem
            if wanted:
                break
        return None, problems

    def how_to_configure(self) -> str:
        """The exact environment variables a user can set to get a working provider."""
        lines = []
        for name, cfg in self.config.providers.items():
            names = [v for v in (cfg.api_key_env, cfg.base_url_env, cfg.model_env) if v]
            if names:
                lines.append(f"  {name} ({cfg.kind}): " + ", ".join(names))
        return "\n".join(lines)

    @property
    def default_provider(self) -> str:
        return self.fallback_provider or self.config.default_provider

    def provider_names(self) -> list[str]:
        return list(self.config.providers)

    def conversation(
        self,
        provider_name: str,
        journal: JournalBox | None = None,
        *,
        policy: ToolPolicy | None = None,
        max_iterations: int | None = None,
    ) -> Conversation:
        """A conversation with its own executor, context manager and guards."""
        agent = self.config.agent
        journal = journal or JournalBox()
        memory = self.memory if self.config.memory.enabled else None
        executor = ToolExecutor(
            self.registry,
            policy or ToolPolicy(session="interactive"),
            ToolContext(sandbox=self.config.tools, journal=journal, memory=memory, jail=self.jail),
            redact=self.redactor,
        )
        provider = self.provider(provider_name)
        summary = self.provider(agent.summary_provider) if agent.summary_provider else provider
        context = ContextManager(
            window=provider.settings.context_window,
            counter=self.counter,
            summarizer=provider_summarizer(summary),
            settings=self.config.context,
            # A run outside any conversation's (a turn sets its conversation's own).
            artifacts_dir=site_for(self.config.tools, "").artifacts,
            session=executor.policy.session,
            after_summary=journal.render_full,
        )
        guards = Guards(
            context=context,
            detector=LoopDetector() if agent.loop_detection else None,
            limits=TimeLimits(agent.soft_time_limit_seconds, agent.hard_time_limit_seconds),
        )
        return Conversation(
            provider=provider,
            executor=executor,
            counter=self.counter,
            system_prompt=agent.system_prompt,
            instructions=self.guidance.instructions(),
            skills=self.guidance.skills_index(),
            loop_config=LoopConfig(
                max_iterations=max_iterations or agent.max_iterations,
                cancel_grace=agent.cancel_grace_seconds,
                parallel_reads=agent.parallel_read_tools,
            ),
            guards=guards,
        )

    async def open_agent(
        self,
        responders: Callable[[ConversationKey], Responder | None] | None = None,
        shared_channels: Collection[str] = (),
    ) -> Agent:
        """The durable agent on the configured store (call `close_agent` when done). On a
        PostgreSQL store it is one of the workers sharing it; it claims the messages of
        `shared_channels` (the platforms `parley run` serves) taken in by any worker."""
        from core.agent import Agent
        from core.eventlog import EventLog
        from core.memory.service import Memory

        store = await open_configured_store(self.config.store, self.environ)
        REAPER.ledger = store  # live tool process groups, for a start-up after a crash
        await self.start_mcp()  # its tools are part of the first turn's registry
        agent = Agent(
            store,
            self,
            events=EventLog(store, self.config.store.resolved_events()),
            approval_timeout=self.config.agent.approval_timeout_seconds,
            responders=responders,
            goal_settings=self.config.goals,
            max_queued=self.config.agent.max_queued,
            shared=shared_settings(self.config.store, shared_channels),
        )
        self.memory = Memory(store, agent.events, self.config.memory)
        return agent

    @contextlib.asynccontextmanager
    async def running_agent(
        self, responders: Callable[[ConversationKey], Responder | None] | None = None
    ) -> AsyncIterator[Agent]:
        """`open_agent` … `close_agent` as one block: the store is closed however the
        block ends, so a script that raises still exits."""
        agent = await self.open_agent(responders)
        try:
            yield agent
        finally:
            await self.close_agent(agent)

    async def close_agent(self, agent: Agent, grace: float = 10.0) -> None:
        """Stop the agent's runs, then close its events log and store (always)."""
        try:
            await agent.shutdown(grace)
        finally:
            try:
                await self.stop_mcp()
                agent.events.close()
            finally:
                if REAPER.ledger is agent.store:
                    REAPER.ledger = None
                await agent.store.aclose()

    def approvers(self, channel: str) -> Collection[str] | None:
        """`core.agent.conversation.ConversationFactory.approvers`: a platform's
        `approvers`; None for the terminal console (whoever runs Parley)."""
        if channel == "console":
            return None
        return self.config.channel(channel).approvers if channel in PLATFORMS else ()

    def _signature(self, config: ParleyConfig) -> tuple[object, ...]:
        """The state of every file a reload reads (see `core.instructions.signature`);
        which files those are is worked out once per configuration."""
        if self._watch_of is not config:
            places = guidance_places(config)
            files = [p for p in (config.source, config.tools_path(), places.workspace_file) if p]
            files += places.channels.values()
            for more in self.watched:
                files += more(config)
            folders = [p for p in (places.library, *places.skills) if p is not None]
            self._watch, self._watch_of = (files, folders), config
        return signature(*self._watch)

    def refresh(self) -> None:
        """Between turns: when config.toml, tools.yaml, an instruction file or a skill
        changed since it was read, read them all again (as SIGHUP does). A configuration
        that does not validate is logged and the running one stays, until the files change
        again."""
        stamps = self._signature(self.config)
        if stamps == self._stamps:
            return
        try:
            config = self.config
            if config.source is not None:
                from bot.config import load_config

                config = load_config(config.source)
            line = self._apply(config)
        except ConfigError as exc:
            self._stamps = stamps
            log.warning(
                "a configuration file changed, but the running configuration stays: %s", exc
            )
            return
        log.info("%s", line)

    def reload(self) -> str:
        """Read config.toml, tools.yaml, the instruction files and the skills again
        (docs/operations.md#reloading). The new settings apply to each conversation from
        its next turn; a turn already running finishes on the old ones.

        Returns a line for the log. Raises `ConfigError` (the running configuration stays)
        if either file is invalid. Channels and jobs are set up at start: changing those
        needs a restart.
        """
        from bot.config import load_config

        if self.config.source is None:
            raise ConfigError("(file)", "the configuration was not read from a file", "restart")
        return self._apply(load_config(self.config.source))

    def _apply(self, config: ParleyConfig) -> str:
        """Make `config` (and the files it names, read now) the running configuration."""
        stamps = self._signature(config)  # before reading: an edit meanwhile shows next time
        guidance = load_guidance(guidance_places(config))
        registry = build_registry(config, self.environ, guidance)  # raises on a bad tools.yaml
        rebuild = _jail_inputs(config) != _jail_inputs(self.config)
        jail = build_jail(config) if rebuild else self.jail
        unchanged = [
            name
            for name in ("channels", "jobs")
            if getattr(config, name) != getattr(self.config, name)
        ]
        check_mcp(config, self.environ)
        self._reload_mcp(config, jail)
        old, self.config, self._base = self.config, config, registry
        self._compose()
        self.guidance, self._stamps = guidance, stamps
        if self.memory is not None:
            self.memory.settings = config.memory
        self.redactor = _redactor(config, self.environ, registry)
        if jail is not self.jail:
            self.retired_jails.append(self.jail)  # running turns may still spawn through it
            self.jail = jail
        self.retired.extend(self.providers.values())
        self.providers = {}
        if self.fallback_provider not in config.providers:
            self.fallback_provider = None
        self.generation += 1
        for hook in self.reload_hooks:
            hook(old, config)
        for warning in guidance.warnings:
            log.warning("%s", warning)
        note = f"; {' and '.join(unchanged)} changed and need a restart" if unchanged else ""
        read = "" if guidance.empty else f"; {guidance.describe()}"
        return f"configuration reloaded (generation {self.generation}){note}{read}"

    def _reload_mcp(self, config: ParleyConfig, jail: Jail) -> None:
        """Apply a reloaded `[mcp]` in the background: servers added, changed or parked
        start again, removed ones stop; their tools follow once listed."""
        if not self._mcp_started:
            return  # `start_mcp` builds the hub from whatever configuration is current
        hub = self.mcp
        if hub is None:
            self.mcp = hub = build_mcp(config, self.environ, jail)
            if hub is not None:
                hub.on_change = self._tools_changed
                self._spawn(hub.start)
            return
        parked = any(c.state == "parked" for c in hub.connections.values())
        if config.mcp == self.config.mcp and jail is self.jail and not parked:
            return
        if not config.mcp.servers:
            self.mcp = None
            self._spawn(hub.stop)
            return

        async def reconfigure() -> None:
            await hub.reconfigure(config.mcp.servers, jail, config.tools)

        self._spawn(reconfigure)

    async def aclose(self) -> None:
        for provider in [*self.providers.values(), *self.retired]:
            await provider.aclose()
        for jail in [self.jail, *self.retired_jails]:
            jail.close()
