"""One MCP server's connection, kept up by a supervisor task (one per server per worker).

The supervisor connects (starts the sandboxed process, or opens the HTTP session),
lists the tools, and then waits for one of: the connection is lost (the process ended,
its stdout closed, a call failed at the transport), a call timed out (it lists the
tools again; no answer in time counts as lost), the tool list changed (it lists again), or
stop. A lost connection is made again after a backoff (0.5 s, doubling, at most 30 s);
`max_restarts` losses within `RESTART_WINDOW` park the server: its tools then answer
the model with an error saying so and `/status` shows it; it is tried again every
`PARKED_RETRY` seconds (a remote server that comes back is used again) and at once when
the configuration is reloaded. A server that has never listed its tools is
`unavailable()`: a call to one of its tools is answered that it failed to start, with the
last line of its stderr (the hub offers that with the tools, core/mcp/hub.py).

Every SDK object lives in the supervisor's task (anyio's task groups must be entered and
left in one task); calls from runs only send requests through the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, TypeVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from core.clock import Clock, SystemClock
from core.errors import ToolError, ToolTimeout, ToolTransientError
from core.mcp.config import McpServerConfig
from core.mcp.stdio import ServerProcess
from core.records import record
from core.secrets import scrub

log = logging.getLogger(__name__)

State = Literal["starting", "ready", "restarting", "parked", "stopped"]
RESTART_WINDOW = 300.0  # seconds in which `max_restarts` losses park a server
PARKED_RETRY = 300.0  # a parked server is tried again this often
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
_LIST_PAGES = 50  # a server that pages forever is cut off here
STDERR_LINES, STDERR_CHARS = 8, 1500  # of a failed call's stderr, added to its error

Opener = Callable[[Callable[[ServerProcess], None]], AbstractAsyncContextManager[Any]]
"""Makes the SDK transport of one connection; told of the process (stdio) it starts."""
T = TypeVar("T")
StderrMark = tuple[ServerProcess, int] | None


@record(frozen=True, slots=True)
class RemoteTool:
    """What Parley keeps of one tool the server lists."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None


class McpConnection:
    """The connection to server `name`, with its state and last tool list."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        opener: Opener,
        *,
        on_tools: Callable[[McpConnection], None] = lambda _c: None,
        clock: Clock | None = None,
    ) -> None:
        self.name, self.config, self._open = name, config, opener
        self._on_tools = on_tools  # told when `tools` or `unavailable()` changes
        self._clock = clock or SystemClock()
        self.state: State = "starting"
        self.tools: tuple[RemoteTool, ...] = ()
        self.last_error = ""
        self.last_stderr = ""  # the last line of stderr of the server that last failed
        self.restarts = 0
        self._told: str | None = None  # the `unavailable()` the hub was last told of
        self._client: Client | None = None
        self._process: ServerProcess | None = None
        self._losses: deque[float] = deque()
        self._settled = asyncio.Event()  # the current attempt connected, or gave up
        self._wake = asyncio.Event()  # something for the live connection to look at
        self._stop = asyncio.Event()
        self._lost = self._stale = self._check = self._stopping = False
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the supervisor and wait for its first attempt (connected or not)."""
        self._task = asyncio.create_task(self._supervise(), name=f"parley-mcp-{self.name}")
        self._task.add_done_callback(_log_crash)
        await self._settled.wait()  # set by the first attempt's outcome

    async def stop(self) -> None:
        """End the connection (the process is stopped) and the supervisor."""
        self._stopping = True
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            await asyncio.wait({self._task})
        self.state = "stopped"
        self._pulse()

    def _pulse(self) -> None:
        """Wake everyone waiting for the state to change."""
        self._settled.set()
        self._settled = asyncio.Event()

    def unavailable(self) -> str | None:
        """Why this server's tools cannot be called while it has never listed any: it
        failed to start (with the last line of its stderr); None otherwise."""
        if self.tools or self.state not in ("restarting", "parked"):
            return None
        why = f"MCP server `{self.name}` failed to start: {self.last_stderr or self.last_error}"
        if self.state == "parked":
            return (
                f"{why}; it is parked after {self.restarts} failures and tried again every "
                f"{PARKED_RETRY / 60:g} minutes, or at a reload (its tools are unknown until then)"
            )
        return f"{why}; it is being started again (its tools are unknown until it starts)"

    def _tell(self) -> None:
        """Tell the hub when `unavailable()` changed (it is offered with the tools)."""
        now = self.unavailable()
        if now != self._told:
            self._told = now
            self._on_tools(self)

    def stderr_mark(self) -> StderrMark:
        """Where the stdio server's stderr is now, for `stderr_since`; None over HTTP."""
        process = self._process
        return (process, process.stderr.total) if process is not None else None

    def stderr_since(self, mark: StderrMark) -> str:
        """The stderr the server wrote after `mark` (scrubbed of known secrets); nothing
        when the process is another one since."""
        if mark is None or mark[0] is not self._process:
            return ""
        process, total = mark
        return scrub(process.stderr.since(total))

    def describe(self) -> str:
        """One line for start-up and `/status`."""
        kind = self.config.transport
        count = f"{len(self.tools)} tool{'s' if len(self.tools) != 1 else ''}"
        match self.state:
            case "ready":
                return f"{self.name} ({kind}, {count})"
            case "parked":
                return (
                    f"{self.name} ({kind}): PARKED after {self.restarts} failures — "
                    f"{self.last_error}; tried again every {PARKED_RETRY / 60:g} minutes, "
                    "or at a reload"
                )
            case _:
                why = f" — {self.last_error}" if self.last_error else ""
                return f"{self.name} ({kind}): {self.state}{why}"

    # --- the supervisor -------------------------------------------------------------------

    async def _supervise(self) -> None:
        while not self._stopping:
            try:
                await self._connection()
            except Exception as exc:  # a failed start or a broken connection
                why = _reason(exc, self._process)
            else:  # the connection was lost (or stopped)
                ended = self._process.why_ended() if self._process is not None else ""
                why = f"the server ended ({ended})" if ended else "the connection was lost"
            finally:
                self._client = None
            if self._stopping:
                return
            self.last_error = scrub(why)
            process = self._process
            self.last_stderr = scrub(process.stderr.last_line()) if process is not None else ""
            log.warning("MCP server %s: %s", self.name, self.last_error)
            if not await self._backoff():
                return

    async def _connection(self) -> None:
        """One connection, from start to loss (or stop)."""
        self._lost = self._stale = self._check = False
        self._process = None
        client = Client(
            self._open(self._adopt),
            message_handler=self._on_message,
            client_info=types.Implementation(name="parley", version="0.1"),
            cache=None,
        )
        # One scope around the whole connection (anyio scopes must nest): its deadline
        # bounds the start, and is lifted once the tools are listed.
        limit = anyio.current_time() + self.config.connect_timeout_seconds
        with anyio.CancelScope(deadline=limit) as starting:
            async with client:
                tools = await self._list(client)
                starting.deadline = math.inf
                self._client, self.state, self.last_error = client, "ready", ""
                self._set_tools(tools)
                self._tell()
                self._pulse()
                async with anyio.create_task_group() as group:
                    if _listens(client):
                        group.start_soon(self._listen, client)
                    await self._serve(client)
                    group.cancel_scope.cancel()
        if starting.cancelled_caught:
            raise TimeoutError("the start took longer than connect_timeout_seconds")

    def _adopt(self, process: ServerProcess) -> None:
        self._process = process
        process.on_lost = self._lose

    async def _serve(self, client: Client) -> None:
        """Wait for the connection to be lost or stopped; list again when told to."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping or self._lost:
                return
            if self._check or self._stale:  # listing the tools is the liveness check too
                checking, self._check, self._stale = self._check, False, False
                try:
                    with anyio.fail_after(self.config.connect_timeout_seconds):
                        tools = await self._list(client)
                except Exception as exc:
                    why = "after a call timed out" if checking else "after its tools changed"
                    raise ConnectionError(f"no answer to tools/list {why}") from exc
                self._set_tools(tools)

    async def _backoff(self) -> bool:
        """After a failure: wait before the next attempt (a parked server waits
        `PARKED_RETRY`); False once stopped."""
        if self.state == "parked":  # the retry of a parked server failed too
            delay = PARKED_RETRY
        else:
            now = self._clock.monotonic()
            self._losses.append(now)
            while self._losses and now - self._losses[0] > RESTART_WINDOW:
                self._losses.popleft()
            self.restarts += 1
            if len(self._losses) >= self.config.max_restarts:
                self.state, delay = "parked", PARKED_RETRY
                log.error("MCP server %s parked: %s", self.name, self.last_error)
            else:
                self.state = "restarting"
                delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (len(self._losses) - 1))
        self._tell()
        self._pulse()  # callers waiting on this attempt go on without it
        sleeper = asyncio.ensure_future(self._clock.sleep(delay))
        stopped = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({sleeper, stopped}, return_when=asyncio.FIRST_COMPLETED)
        sleeper.cancel()
        stopped.cancel()
        self._wake.clear()  # what the lost connection was told no longer matters
        return not self._stopping

    async def _list(self, client: Client) -> tuple[RemoteTool, ...]:
        tools: list[RemoteTool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools += [_remote(tool) for tool in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        return tuple(tools)

    def _set_tools(self, tools: tuple[RemoteTool, ...]) -> None:
        if tools != self.tools:
            self.tools = tools
            self._on_tools(self)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._stale = True
            self._wake.set()

    async def _listen(self, client: Client) -> None:
        """A 2026-era server says its tool list changed on a `subscriptions/listen`; a
        stream that ends (an HTTP read timeout between changes) is opened again."""
        while True:
            with contextlib.suppress(Exception):
                async with client.listen(tools_list_changed=True) as events:
                    async for _event in events:
                        self._stale = True
                        self._wake.set()
            await anyio.sleep(1.0)  # cancelled with the connection

    def _lose(self) -> None:
        """The connection is gone: calls from now on wait for the next one."""
        self._lost = True
        if self._client is not None and not self._stopping:
            self._client, self.state = None, "restarting"
        self._wake.set()

    # --- calls ----------------------------------------------------------------------------

    async def request(self, what: str, send: Callable[[Client], Awaitable[T]], within: float) -> T:
        """Send one request through the live connection, within `within` seconds.

        Raises:
            ToolError: the server is parked, or answered with a JSON-RPC error.
            ToolTimeout: no answer in time (the connection is checked with a ping).
            ToolTransientError: the server is (re)starting, or the connection was lost.
        """
        client = await self._live(min(within, self.config.connect_timeout_seconds))
        mark = self.stderr_mark()
        try:
            async with asyncio.timeout(within):
                return await send(client)
        except TimeoutError:
            self._check = True
            self._wake.set()
            raise ToolTimeout(
                f"{what} on MCP server `{self.name}` did not answer within {within:g} s "
                f"(mcp.servers.{self.name}.timeout_seconds); the request was cancelled"
            ) from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._lose()
                raise ToolTransientError(
                    f"the connection to MCP server `{self.name}` was lost during {what}"
                ) from exc
            note = stderr_note(self.stderr_since(mark))
            why = exc.message or "no detail"
            raise ToolError(f"MCP server `{self.name}` refused {what}: {why}{note}") from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            self._lose()
            raise ToolTransientError(
                f"the connection to MCP server `{self.name}` was lost during {what}"
            ) from exc

    async def _live(self, wait: float) -> Client:
        """The connected client, waiting up to `wait` seconds for a (re)start."""
        if self.state == "parked":
            raise ToolError(
                f"MCP server `{self.name}` is parked after {self.restarts} failures "
                f"({self.last_error}); its tools are unavailable until it answers again (it is "
                f"tried every {PARKED_RETRY / 60:g} minutes)"
            )
        if self.state == "stopped":
            raise ToolError(f"MCP server `{self.name}` was stopped")
        if self._client is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    while self._client is None and self.state in ("starting", "restarting"):
                        await self._settled.wait()
        client = self._client
        if client is not None:
            return client
        if self.state in ("parked", "stopped"):  # it gave up while we waited
            return await self._live(0)
        why = f": {self.last_error}" if self.last_error else ""
        raise ToolTransientError(f"MCP server `{self.name}` is {self.state}{why}")


def stderr_note(stderr: str) -> str:
    """The end of what a server wrote to stderr during a call that failed, as a note for
    its error: SDKs often answer an exception with a bare "Error executing tool NAME" and
    log the why there."""
    lines = stderr.splitlines()[-STDERR_LINES:]
    if not lines:
        return ""
    tail = "\n".join(lines)
    if len(tail) > STDERR_CHARS:
        tail = "…" + tail[-STDERR_CHARS:]
    return f"\nthe server's stderr during the call ends:\n{tail}"


def _remote(tool: types.Tool) -> RemoteTool:
    notes = tool.annotations
    return RemoteTool(
        name=tool.name,
        description=(tool.description or tool.title or "").strip(),
        input_schema=dict(tool.input_schema),
        read_only_hint=notes.read_only_hint if notes is not None else None,
        destructive_hint=notes.destructive_hint if notes is not None else None,
    )


def _listens(client: Client) -> bool:
    """A 2026-era server that announces tool list changes (older ones notify)."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    tools = client.server_capabilities.tools
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS and bool(
        tools is not None and tools.list_changed
    )


def _reason(exc: BaseException, process: ServerProcess | None) -> str:
    """Why a connection failed, for a person: the first real cause, and how the
    process ended."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        text = "it did not connect and list its tools in time (connect_timeout_seconds)"
    if process is not None and process.proc.poll() is not None:
        text += f" ({process.why_ended()})"
    return text


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("MCP supervisor crashed", exc_info=task.exception())


__all__ = ["McpConnection", "Opener", "RemoteTool", "State", "StderrMark", "stderr_note"]
