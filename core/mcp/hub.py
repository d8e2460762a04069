"""The MCP servers of one worker: their connections, and the tools they give the model.

`McpHub` builds one `McpConnection` per `[mcp.servers.<name>]` and turns their tool lists
into Parley tools (`core/mcp/tools.py`): a `deny` tool is never offered, and the hub
keeps why, so a call by name is refused with the reason; likewise a call to a tool of a
server that failed to start is answered with why (`McpConnection.unavailable`), not as a
misspelt name. When a server's tool list
changes (it said so, or it was restarted), `on_change` is called; the application then
rebuilds its registry, which conversations pick up before their next turn — a running
turn keeps the tools it started with.

stdio servers run through the tools' sandbox (core/mcp/stdio.py); HTTP servers get an
`httpx2` client with the configured headers and timeouts that reaches the configured
origin only (the SDK follows a redirect only within it; a hook refuses anything else).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from core.clock import Clock
from core.mcp.config import McpServerConfig, check_env, command_files
from core.mcp.connection import McpConnection, Opener
from core.mcp.install import cache_env, installation
from core.mcp.stdio import (
    Launch,
    ServerProcess,
    server_env,
    stdio_transport,
    trusted_repositories,
)
from core.mcp.tools import McpFeatureTool, McpTool, tool_name
from core.sandbox import SYSTEM_ROOTS, Jail, SandboxSettings, default_temp_root, make_root
from core.tools.base import Tool

log = logging.getLogger(__name__)
SILENT_STREAM = 300.0  # seconds an HTTP server's stream may stay silent


def _argv(config: McpServerConfig, base: Path) -> list[str]:
    """`command` with relative paths that name files under `base` made absolute."""
    argv = []
    for item in config.command or ():
        candidate = base / os.path.expanduser(item)
        relative = not item.startswith(("-", "/", "~"))
        argv.append(str(candidate) if relative and candidate.is_file() else item)
    return argv


def _named_dirs(argv: list[str]) -> list[Path]:
    """The directories `argv` names (`/srv/repo`, `--repository=/srv/repo`)."""
    named = []
    for item in argv[1:]:
        value = item.partition("=")[2] if item.startswith("-") else item
        if value.startswith(("/", "~")) and Path(os.path.expanduser(value)).is_dir():
            named.append(Path(os.path.expanduser(value)))
    return named


def server_directory(name: str, config: McpServerConfig, state: Path) -> Path:
    """A stdio server's own read-write directory: `directory`, else `mcp/<name>` in
    Parley's state directory (`state`: where the store is, `~/.parley`) — outside every
    workspace, so no tool can plant files where a server that holds credentials reads."""
    if config.directory is not None:
        return Path(os.path.expanduser(config.directory)).resolve()
    return state / "mcp" / name


class McpHub:
    """Every configured MCP server of this worker."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        *,
        jail: Jail,
        sandbox: SandboxSettings,
        environ: Mapping[str, str],
        base: Path,
        state: Path,
        on_change: Callable[[], None] = lambda: None,
        clock: Clock | None = None,
    ) -> None:
        """Raises:
        ConfigError: a variable that `env` or `headers_env` names is not set."""
        self.jail, self.sandbox, self.environ, self.base = jail, sandbox, environ, base
        self.state = state
        self.on_change = on_change
        self._clock = clock
        self.configs = dict(servers)
        self._headers = {name: check_env(name, cfg, environ) for name, cfg in servers.items()}
        self.connections = {name: self._connection(name, cfg) for name, cfg in servers.items()}
        self.refused: dict[str, str] = {}
        self._tools: list[Tool] = []

    def _connection(self, name: str, config: McpServerConfig) -> McpConnection:
        opener = self._stdio(name, config) if config.command else self._http(name, config)
        return McpConnection(
            name, config, opener, on_tools=lambda _c: self._changed(), clock=self._clock
        )

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to every server at once; each waits at most its connect timeout. A
        server that fails goes on trying in the background."""
        await asyncio.gather(*(c.start() for c in self.connections.values()))
        self._rebuild()

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.connections.values()))

    async def reconfigure(
        self, servers: Mapping[str, McpServerConfig], jail: Jail, sandbox: SandboxSettings
    ) -> None:
        """Apply a reloaded `[mcp]`: servers removed or changed are stopped, new and
        changed ones (and parked ones) started; the rest keep their connection."""
        headers = {name: check_env(name, cfg, self.environ) for name, cfg in servers.items()}
        self.jail, self.sandbox = jail, sandbox
        keep = {
            name
            for name, cfg in servers.items()
            if self.configs.get(name) == cfg
            and self._headers.get(name) == headers[name]
            and self.connections[name].state != "parked"
        }
        old = [c for name, c in self.connections.items() if name not in keep]
        await asyncio.gather(*(c.stop() for c in old))
        self.configs, self._headers = dict(servers), headers
        fresh = {n: self._connection(n, cfg) for n, cfg in servers.items() if n not in keep}
        self.connections = {n: fresh.get(n) or self.connections[n] for n in servers}
        await asyncio.gather(*(c.start() for c in fresh.values()))
        self._changed()

    # --- tools ----------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The tools the servers offer now (deny ones left out; see `refused`)."""
        return list(self._tools)

    def _changed(self) -> None:
        self._rebuild()
        self.on_change()

    def _rebuild(self) -> None:
        tools: list[Tool] = []
        refused: dict[str, str] = {}
        names: set[str] = set()
        for connection in self.connections.values():
            config, server = connection.config, connection.name
            for remote in connection.tools:
                name = tool_name(server, remote.name)
                category = config.category(
                    remote.name,
                    read_only_hint=remote.read_only_hint,
                    destructive_hint=remote.destructive_hint,
                )
                if category == "deny":
                    where = (
                        f"mcp.servers.{server}.tools.{remote.name}"
                        if remote.name in config.tools
                        else f"mcp.servers.{server}.default"
                    )
                    refused[name] = f'`{name}` is denied by the configuration ({where} = "deny")'
                elif name in names:
                    log.warning("MCP server %s: a second tool named %s is left out", server, name)
                else:
                    names.add(name)
                    tools.append(McpTool(name, remote, connection, category))
            if (why := connection.unavailable()) is not None:  # its tools are not known
                refused[f"{tool_name(server, '')}*"] = why
            for action, offered in (
                ("resources_list", config.resources),
                ("resources_read", config.resources),
                ("prompts_list", config.prompts),
                ("prompts_get", config.prompts),
            ):
                if offered is not None and tool_name(server, action) not in names:
                    names.add(tool_name(server, action))
                    tools.append(McpFeatureTool(connection, action, offered))
        self._tools, self.refused = tools, refused

    def describe(self) -> str:
        """One line for start-up and `/status`."""
        return "mcp: " + "; ".join(c.describe() for c in self.connections.values())

    # --- transports -----------------------------------------------------------------------

    def _stdio(self, name: str, config: McpServerConfig) -> Opener:
        def open_stdio(on_process: Callable[[ServerProcess], None]) -> Any:
            return self._sandboxed(name, config, on_process)

        return open_stdio

    @contextlib.asynccontextmanager
    async def _sandboxed(
        self, name: str, config: McpServerConfig, on_process: Callable[[ServerProcess], None]
    ) -> AsyncIterator[Any]:
        """One start of a stdio server, in a fresh temp dir removed after it."""
        launch, scratch = await asyncio.to_thread(self._launch, name, config)
        try:
            async with stdio_transport(launch, on_process) as streams:
                yield streams
        finally:
            if launch.spawn is not None:
                launch.spawn.close()
            await asyncio.to_thread(shutil.rmtree, scratch, True)

    def _launch(self, name: str, config: McpServerConfig) -> tuple[Launch, Path]:
        """How to start a stdio server now: its directory (made), a fresh temp dir, and
        the spawn of the tools' sandbox (the current jail's)."""
        jail = self.jail
        directory = server_directory(name, config, self.state)
        owner = (jail.run_as.uid, jail.run_as.gid) if jail.run_as is not None else None
        make_root(directory, owner)
        root = default_temp_root() / "mcp"
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        if owner is not None:  # its HOME: git and others check theirs with access(2)
            os.chown(scratch, *owner)
        argv = _argv(config, self.base)
        env = server_env(config.env, self.environ, scratch)
        read_paths = [Path(os.path.expanduser(p)) for p in config.read_paths]
        readable = [
            *command_files(config, self.base),
            *read_paths,
            *installation(argv, path=env["PATH"], cwd=directory, system=SYSTEM_ROOTS),
        ]
        if not config.only_reads():  # a read-only server's directory cannot hold a cache
            env.update(cache_env(argv, directory))
        env.update(trusted_repositories(env, [directory, *read_paths, *_named_dirs(argv)]))
        spawn = jail.prepare(
            scratch,
            workspace=directory,
            read_only=config.only_reads(),
            readable=readable,
            memory="data",  # V8 reserves far more than it uses (see MemoryLimit)
        )
        return Launch(argv, env, directory, spawn), scratch

    def _http(self, name: str, config: McpServerConfig) -> Opener:
        def open_http(_on_process: Callable[[ServerProcess], None]) -> Any:
            return _http_transport(config, self._headers[name])

        return open_http


@contextlib.asynccontextmanager
async def _http_transport(config: McpServerConfig, headers: dict[str, str]) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert config.url is not None
    origin = httpx2.URL(config.url)

    async def same_origin(request: httpx2.Request) -> None:
        url = request.url
        if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port):
            raise httpx2.UnsupportedProtocol(f"refused: {url} is not the configured server")

    # Calls are bounded by `timeout_seconds` (the connection's own deadline); the read
    # timeout ends a stream that went silent, as the tool-list subscription's is between
    # changes (it is opened again).
    timeout = httpx2.Timeout(
        max(SILENT_STREAM, config.timeout_seconds + 5),
        connect=config.connect_timeout_seconds,
        pool=config.connect_timeout_seconds,
    )
    async with (
        httpx2.AsyncClient(
            headers=headers,
            timeout=timeout,
            follow_redirects=False,
            max_redirects=3,
            event_hooks={"request": [same_origin]},
        ) as client,
        streamable_http_client(config.url, http_client=client) as streams,
    ):
        yield streams


__all__ = ["McpHub", "server_directory"]
