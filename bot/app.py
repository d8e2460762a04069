"""Builds Parley's parts from the configuration, once per process, and reloads them.

The builders of the parts are `bot.wiring`; what one conversation is built of is
`bot.conversations`; which provider a command can use is `bot.provider_choice`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config import ParleyConfig
from bot.conversations import build_conversation
from bot.wiring import (
    LOCAL_HOSTS,
    _jail_inputs,
    _redactor,
    build_jail,
    build_mcp,
    build_registry,
    check_mcp,
    config_files,
    configured_secrets,
    guidance_places,
    open_configured_store,
    secret_env_names,
    shared_settings,
)
from channels import PLATFORM_NAMES
from core.agent.conversation import Conversation
from core.agent.journal import JournalBox
from core.chat import ConversationKey, Responder
from core.clock import Clock, SystemClock
from core.context.tokens import TokenCounter
from core.errors import ConfigError
from core.instructions import Guidance, load_guidance, signature
from core.instructions.tool import LoadSkillTool
from core.providers import Provider, build_provider
from core.providers.base import ProviderSettings
from core.providers.failover import Breakers
from core.records import record
from core.redact import Redactor
from core.sandbox import REAPER, Jail, make_undumpable
from core.tools.base import RoleGate, ToolRegistry
from core.tools.policy import ToolPolicy
from core.tools.search import with_search
from core.triggers.kinds import THREAD_CHANNEL

if TYPE_CHECKING:
    # The durable agent and its store are loaded by what opens them (`open_agent`): the
    # one-shot `parley chat -m` uses neither (docs/benchmarks.md).
    from core.agent import Agent
    from core.mcp.hub import McpHub
    from core.memory.service import Memory
    from core.roles import Roles

log = logging.getLogger(__name__)

ReloadHook = Callable[[ParleyConfig, ParleyConfig], None]
"""Called as `hook(old, new)` after each successful reload (SIGHUP or a watched file),
between turns, before any conversation is built from `new`."""


@record(slots=True)
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
    clock: Clock = field(default_factory=SystemClock)  # the failover breakers' time
    # One per worker, shared by its conversations (docs/providers.md#failover).
    breakers: Breakers = field(init=False)
    _roles: Roles | None = field(init=False, default=None)  # see `roles`
    # Told the tools added and removed whenever the registry changes (the audit log).
    tool_hooks: list[Callable[[list[str], list[str]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # No tool (and no other process of this user) may read our memory or environment.
        make_undumpable()
        self.redactor = _redactor(self.config, self.environ, self.registry)
        self.jail = build_jail(self.config)
        self.breakers = Breakers(self.config.failover, self.clock)
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

    @property
    def roles(self) -> Roles:
        """Who may do what (docs/governance.md), following reloads; built when first asked
        for (the agent's runs ask, a one-shot `parley chat -m` does not)."""
        if self._roles is None:
            from core.roles import Roles

            self._roles = Roles(self.config.roles, self.approvers)
        return self._roles

    def terminal_role(self) -> RoleGate | None:
        """The role of whoever runs Parley in the terminal (`[roles] terminal`), for a run
        outside the agent (`parley chat -m`). None without `[roles]`: then it is the
        built-in `admin`, which allows every tool (and `core.roles` stays unloaded)."""
        if not self.config.has_section("roles"):
            return None
        from core.roles import TERMINAL

        return self.roles.of(TERMINAL, "")

    def _compose(self) -> None:
        """The registry: the configured tools plus what the MCP servers offer now."""
        extra = self.mcp.tools() if self.mcp is not None else []
        refused = self.mcp.refused if self.mcp is not None else None
        threshold = self.config.tools.search_threshold
        before = set(self.registry.names())
        self.registry = with_search([*self._base.tools(), *extra], refused, threshold)
        after = set(self.registry.names())
        if before != after:
            for hook in self.tool_hooks:
                hook(sorted(after - before), sorted(before - after))

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

    def choose_provider(self, wanted: str | None = None) -> tuple[str | None, dict[str, str]]:
        """The wanted (or default) provider if usable, else the first usable one, and the
        problems of the others (`bot.provider_choice`): for callers that hold an app, such as
        the shared benchmark's driver."""
        from bot.provider_choice import choose_provider

        return choose_provider(self.config, self.environ, wanted)

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
        key: ConversationKey | None = None,
    ) -> Conversation:
        """A conversation with its own executor, context manager and guards
        (`bot.conversations.build_conversation`). A trigger's conversation (`key`
        `trigger:NAME:…`) runs under the trigger's policy — the cron policy with its
        `allow_tools`, nobody asked — and its provider, also for people who reply in its
        thread: its history holds data from outside (docs/triggers.md#untrusted-data)."""
        if key is not None and key[0] == THREAD_CHANNEL:
            trigger = self.config.triggers.get(key[1])
            allowed = frozenset(trigger.allow_tools) if trigger is not None else frozenset()
            policy = ToolPolicy(session="cron", allow_tools=allowed)
            if trigger is not None and trigger.provider:
                provider_name = trigger.provider
        return build_conversation(
            self, provider_name, journal, policy=policy, max_iterations=max_iterations
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
        from core.cost.meter import Ledger
        from core.cost.prices import PriceTable
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
            roles=self.roles,
            ledger=Ledger(store, PriceTable(self.config.prices), self.config.budgets),
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
        return self.config.channel(channel).approvers if channel in PLATFORM_NAMES else ()

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
            if self.config.source is not None:
                exc.in_file(self.config.source)
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
        try:
            return self._apply(load_config(self.config.source))
        except ConfigError as exc:
            exc.in_file(self.config.source)  # a problem found past the schema names no file
            raise

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
        self.breakers.settings = config.failover  # breakers made from now on
        if self._roles is not None:  # else built from `config` when first asked for
            self._roles.reconfigure(config.roles)
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


__all__ = [  # the builders live in `bot.wiring`; importing them from here still works
    "LOCAL_HOSTS",
    "App",
    "ReloadHook",
    "build_jail",
    "build_mcp",
    "build_registry",
    "check_mcp",
    "config_files",
    "configured_secrets",
    "guidance_places",
    "open_configured_store",
    "secret_env_names",
    "shared_settings",
]
