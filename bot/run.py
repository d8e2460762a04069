"""`parley run`: every enabled channel (and the console, if asked) in one process, sharing
one agent and one store; scheduled jobs too. SIGTERM (or Ctrl-C) stops taking input, lets
running turns reach a checkpoint and closes every connection."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

from pydantic import BaseModel

from bot.collector import start_up_done
from bot.operate import page_note, start_server, start_telemetry, stop_server, stop_telemetry
from bot.singletons import Singletons, channel_singletons, scheduler_singleton, worker_id
from channels.platforms import PLATFORMS
from core.chat import ConversationKey, Responder
from core.sandbox import describe_places
from core.store import SharedStore
from core.triggers.kinds import THREAD_CHANNEL

if TYPE_CHECKING:
    from bot.app import App
    from bot.config import ParleyConfig
    from bot.jobs import Scheduler
    from bot.server import OpsServer
    from channels.base import Channel
    from channels.console import ConsoleChannel
    from core.agent import Agent

SHUTDOWN_GRACE = 20.0


def build_channels(app: App) -> dict[str, Channel]:
    """The enabled platform adapters (each SDK is imported only when its platform is)."""
    built: dict[str, Channel] = {}
    for name, platform in PLATFORMS.items():
        settings = app.config.channel(name)
        if settings.enabled:
            built[name] = platform.build(settings, app.environ, app.roles)
    return built


def responders_of(
    channels: Mapping[str, Channel],
) -> Callable[[ConversationKey], Responder | None]:
    """Where the agent posts into a conversation it has no inbound message of."""

    def responder(key: ConversationKey) -> Responder | None:
        channel = channels.get(key[0])
        return channel.responder(key) if channel is not None else None

    return responder


def _reload(app: App, out: TextIO) -> None:
    """SIGHUP: read the configuration again; each conversation uses it from its next turn.
    A file that does not validate leaves the running configuration in place."""
    from core.errors import ConfigError

    try:
        line = app.reload()
    except ConfigError as exc:
        out.write(f"parley: reload failed, keeping the running configuration\n{exc}\n")
    else:
        out.write(f"parley: {line}\n")
    out.flush()


def _dumped(config: ParleyConfig, key: str) -> object:
    """A section's settings alone (a section's caches of resolved paths do not count)."""
    value = getattr(config, key)
    return value.model_dump() if isinstance(value, BaseModel) else value


def _agent_follows_reloads(app: App, agent: Agent) -> None:
    """After every reload (SIGHUP, or a configuration file edited between turns) the
    agent's own settings follow, and the events log and the audit log say so (also when
    the tool set changes: an MCP server's tools)."""

    def reloaded(old: ParleyConfig, new: ParleyConfig) -> None:
        agent.approval_timeout = new.agent.approval_timeout_seconds
        agent.goal_settings = new.goals
        agent.events.emit("config.reloaded", {"generation": app.generation})
        keys = [*type(new).model_fields, *type(new).sections()]
        changed = [k for k in keys if _dumped(old, k) != _dumped(new, k)]
        detail = {"generation": app.generation, "changed": changed}
        agent.audit.record("config.reloaded", "parley", detail)

    def tools_changed(added: list[str], removed: list[str]) -> None:
        detail = {"generation": app.generation, "added": added, "removed": removed}
        agent.audit.record("tools.reloaded", "parley", detail)

    app.reload_hooks.append(reloaded)
    app.tool_hooks.append(tools_changed)


async def run_all(app: App, *, console: bool, out: TextIO | None = None) -> int:
    """Start everything, wait for SIGTERM/SIGINT (or the console's /exit), stop cleanly."""
    out = out or sys.stderr
    all_channels, console_channel = _channels(app, console, out)
    platforms = [name for name in all_channels if name != "console"]  # the console is local
    if app.config.triggers:  # refused before anything opens (docs/triggers.md)
        from bot.hooks import check_triggers

        check_triggers(app, all_channels)
        platforms.append(THREAD_CHANNEL)  # any worker runs a trigger's conversation
    agent = await app.open_agent(responders_of(all_channels), shared_channels=platforms)
    if app.config.triggers:
        from bot.trigger_threads import TriggerThreads

        agent.threads = TriggerThreads(agent.store, all_channels, agent.events)
    scheduler = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _agent_follows_reloads(app, agent)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload(app, out))
    started: list[Channel] = []
    leased: Singletons | None = None
    server: OpsServer | None = None
    telemetry = None
    try:
        telemetry = start_telemetry(app)
        out.write(f"parley: provider {app.default_provider}; store {agent.store.describe()}\n")
        out.write(f"parley: {app.jail.describe()}\n")
        out.write(f"parley: {describe_places(app.config.tools)}\n")
        for line in app.guidance.start_up_lines():  # as `parley chat` prints them
            out.write(f"parley: {line}\n")
        for line in app.tool_status():  # the MCP servers, connected by open_agent
            out.write(f"parley: {line}\n")
        for name, channel in all_channels.items():
            out.write(f"parley: {name}: may talk to it: {channel.access()}\n")
        if app.config.jobs:
            from bot.jobs import Scheduler

            scheduler = Scheduler(app, agent, all_channels)
            scheduler.validate()  # a bad job stops start-up before anything connects
            agent.cron = scheduler  # fires a dead worker left are taken over (any worker)
        leased = _singletons(app, agent, all_channels, scheduler, out)  # before channels start
        server = await start_server(app, agent, all_channels, leased)
        if server is not None:
            out.write(
                f"parley: operator's endpoint on {server.url}: /healthz, /readyz, /metrics; "
                f"{page_note(app)}\n"
            )
            for name in sorted(app.config.triggers):
                out.write(f"parley: trigger {name}: POST {server.url}/hooks/{name}\n")
        # Imports, configuration and store are done: the collector comes back before
        # anything connects (a platform that keeps a start waiting) or a turn runs.
        start_up_done()
        for channel in all_channels.values():
            await channel.start(agent)
            started.append(channel)
        if scheduler is not None and leased is None:
            await scheduler.start()
        if scheduler is not None:
            out.write(f"parley: {len(app.config.jobs)} scheduled job(s)\n")
        await agent.reconcile()
        if scheduler is not None and leased is None:  # one process: what a crash left
            await scheduler.take_over_fires()
        if leased is not None:
            leased.start()
        if server is not None:
            server.serving = True
        await _serve(stop, console_channel, out)
    finally:
        if server is not None:
            server.serving = False  # /readyz: 503 while stopping, so traffic moves away
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if leased is not None:
            await leased.stop()  # stops polling and scheduling here; successors take over
        if scheduler is not None:
            await scheduler.shutdown(grace=SHUTDOWN_GRACE)
        await app.close_agent(agent, grace=SHUTDOWN_GRACE)  # before channels: replies still post
        for channel in reversed(started):
            with contextlib.suppress(Exception):
                await channel.stop()
        await stop_server(server)
        stop_telemetry(telemetry)
        out.write("parley: stopped\n")
        out.flush()
    return 0


def _singletons(
    app: App,
    agent: Agent,
    channels: Mapping[str, Channel],
    scheduler: Scheduler | None,
    out: TextIO,
) -> Singletons | None:
    """On a shared store, the lease holders of this worker's singletons (not started);
    None on SQLite, where this process holds everything."""
    store = app.config.store
    leases = agent.store
    if not store.shared() or not isinstance(leases, SharedStore):
        return None
    found = channel_singletons(channels)
    if scheduler is not None:
        found.append(scheduler_singleton(scheduler, store.lease_seconds))
    leased = Singletons(
        leases,
        found,
        # one id for heartbeats and leases: the agent's, when it joined as a worker
        worker=agent.workers.id if agent.workers is not None else worker_id(),
        lease_seconds=store.lease_seconds,
        events=agent.events,
        out=out,
    )
    names = ", ".join(leased.names()) or "none"
    out.write(f"parley: worker {leased.worker}; leased singletons: {names}\n")
    return leased


def _channels(
    app: App, console: bool, out: TextIO
) -> tuple[dict[str, Channel], ConsoleChannel | None]:
    """The enabled channels, and the terminal console if asked for (or if none is)."""
    channels = build_channels(app)
    if not channels and not console:
        out.write(
            f"parley: no channel is enabled in {app.config.source or 'config.toml'} "
            "([channels.slack] enabled = true, …); "
            "starting the terminal console instead\n"
        )
        console = True
    if not console:
        return channels, None
    from channels.console import ConsoleChannel

    console_channel = ConsoleChannel(app.config.agent.approval_timeout_seconds)
    channels["console"] = console_channel
    return channels, console_channel


async def _serve(stop: asyncio.Event, console_channel: ConsoleChannel | None, out: TextIO) -> None:
    """Ready: wait for a stop signal, or for the console to close."""
    out.write("parley: ready\n")
    out.flush()
    waiters = [asyncio.create_task(stop.wait())]
    if console_channel is not None:
        waiters.append(asyncio.create_task(console_channel.closed.wait()))
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    out.write("parley: stopping (letting running turns reach a checkpoint)\n")
    out.flush()
