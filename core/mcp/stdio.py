"""A stdio MCP server inside the tools' kernel sandbox: one long-lived process per server.

The process is started as a tool's is (core/sandbox/jail.py): from a confined throwaway
thread, so it runs under Landlock (its own directory read-write, its temp dir, the system
dirs, what `read_paths` lists and its installation (core/mcp/install.py) readable; no
`$HOME`, no `/proc`, no other conversation's files, Parley's configuration read-only),
the network mode's seccomp filter, the resource limits (memory as its data size, see
`core.sandbox.jail.MemoryLimit`), as `run_as` when Parley is root, and as the first process
of a PID namespace of its own; the reaper kills it if Parley dies. Its environment is a
minimal `PATH` and `LANG`, its temp dir as `HOME` and `TMPDIR`, the variables its
configuration names, git's `safe.directory` for its directories (`trusted_repositories`)
and, for `npx`/`uvx`, a package cache in its own directory.

`stdio_transport` bridges the pipes to the SDK's message streams (newline-delimited
JSON-RPC). A line longer than `MAX_MESSAGE_BYTES` ends the connection: the server is
broken, and its supervisor starts another.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.client import Transport
from mcp.shared.message import SessionMessage

from core.errors import ToolError
from core.records import record
from core.sandbox import REAPER, Spawn

MAX_MESSAGE_BYTES = 64 << 20
"""One JSON-RPC message from a server; a 20 MB tool result fits, an endless line does not."""
STDERR_KEPT = 4096  # bytes of a server's stderr kept to explain why it ended
_EXIT_GRACE = 2.0  # after stdin closes, before the kill


@record(frozen=True, slots=True)
class Launch:
    """How to start one stdio server: argv, environment, working directory and the
    sandbox spawn (None: the sandbox is off or not enforced)."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    spawn: Spawn | None


def server_env(names: Sequence[str], environ: Mapping[str, str], scratch: Path) -> dict[str, str]:
    """A server's whole environment: `PATH`, `LANG`, its temp dir as `HOME` and `TMPDIR`,
    and the host variables `names` lists (checked present at start-up)."""
    env = {"PATH": environ.get("PATH", os.defpath), "HOME": str(scratch), "TMPDIR": str(scratch)}
    if "LANG" in environ:
        env["LANG"] = environ["LANG"]
    env.update({name: environ[name] for name in names if name in environ})
    return env


def trusted_repositories(env: Mapping[str, str], roots: Sequence[Path]) -> dict[str, str]:
    """git configuration, as variables, that trusts the repositories at `roots` (and,
    from git 2.46, beneath them) whoever owns them: a server running as `run_as` would
    otherwise find the operator's repositories of "dubious ownership" and refuse them.
    Appended to any `GIT_CONFIG_COUNT` entries `env` already holds."""
    places: list[str] = []
    for root in roots:
        for path in dict.fromkeys((str(root), str(root.resolve()))):
            places += [path, path.rstrip("/") + "/*"]
    try:
        first = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        first = 0
    trust = {"GIT_CONFIG_COUNT": str(first + len(places))}
    for i, place in enumerate(places, start=first):
        trust[f"GIT_CONFIG_KEY_{i}"] = "safe.directory"
        trust[f"GIT_CONFIG_VALUE_{i}"] = place
    return trust


def start(launch: Launch) -> subprocess.Popen[bytes]:
    """Start the server process (in its sandbox, in a process group of its own).

    Raises:
        ToolError: the program does not exist or cannot be run.
    """
    program = launch.argv[0]
    found = (
        (launch.cwd / program).exists()
        if "/" in program
        else shutil.which(program, path=launch.env.get("PATH", os.defpath)) is not None
    )
    if not found:
        raise ToolError(f"cannot start `{program}`: No such file or directory")
    spawn = launch.spawn
    command = list(launch.argv) if spawn is None else spawn.command(launch.argv)

    def popen() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            cwd=launch.cwd,
            env=dict(launch.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    try:
        proc = popen() if spawn is None else spawn.start(popen)
    except OSError as exc:
        raise ToolError(f"cannot start `{program}`: {exc.strerror or exc}") from exc
    REAPER.track(proc.pid)
    return proc


class _Tail(asyncio.Protocol):
    """Keeps the last `STDERR_KEPT` bytes of the server's stderr, and counts them all."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.total = 0  # bytes ever received: a mark to ask what came `since`
        self.ended = asyncio.Event()  # stderr reached its end (all of it was read)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        self.total += len(data)
        while self.size - len(self.chunks[0]) >= STDERR_KEPT:
            self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks)[-STDERR_KEPT:].decode("utf-8", "replace").strip()

    def since(self, mark: int) -> str:
        """What arrived after `total` was `mark` (as much of it as is still kept)."""
        new = min(self.total - mark, self.size, STDERR_KEPT)
        kept = b"".join(self.chunks)
        return kept[len(kept) - new :].decode("utf-8", "replace").strip() if new > 0 else ""

    def last_line(self) -> str:
        lines = self.text().splitlines()
        return lines[-1].strip() if lines else ""


class ServerProcess:
    """A running stdio server: its process, its stderr's tail and its exit."""

    def __init__(self, proc: subprocess.Popen[bytes], spawn: Spawn | None) -> None:
        self.proc = proc
        self.spawn = spawn
        self.stderr = _Tail()
        self.exited = asyncio.Event()
        self.on_lost: Callable[[], None] | None = None  # told when the connection is gone
        self._pidfd = -1
        self._transports: list[asyncio.BaseTransport] = []

    async def watch(self) -> None:
        """Follow its exit (a pidfd on the event loop) and its stderr."""
        loop = asyncio.get_running_loop()
        self._pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self._pidfd, self._on_exit)
        transport, _ = await loop.connect_read_pipe(lambda: self.stderr, self.proc.stderr)
        self._transports.append(transport)

    def _on_exit(self) -> None:
        if self.proc.poll() is not None:
            self.exited.set()
            self.lose()
            self._unwatch()

    def lose(self) -> None:
        """It exited, or its stdout ended: the connection is gone."""
        if self.on_lost is not None:
            self.on_lost()

    def _unwatch(self) -> None:
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def adopt(self, transport: asyncio.BaseTransport) -> None:
        self._transports.append(transport)

    def why_ended(self) -> str:
        """The exit status and the last of stderr, for the log and `/status`."""
        code = self.proc.poll()
        if code is None:
            status = "still running"
        elif code < 0:
            status = f"killed by signal {-code}"
        elif code > 128 and self.spawn is not None and self.spawn.pid_namespaces is not None:
            status = f"killed by signal {code - 128}"  # reported by the namespace's init
        else:
            status = f"exit status {code}"
        tail = self.stderr.text().splitlines()[-3:]
        return status + (f"; stderr: {' | '.join(tail)}" if tail else "")

    async def stop(self) -> None:
        """Close stdin, give it `_EXIT_GRACE` seconds, then kill its whole group."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_EXIT_GRACE):
                await self.exited.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_EXIT_GRACE):
                await self.exited.wait()
        self._unwatch()
        await asyncio.to_thread(self.proc.wait)
        REAPER.untrack(self.proc.pid)
        with contextlib.suppress(TimeoutError):  # its last words explain why it ended
            async with asyncio.timeout(_EXIT_GRACE):
                await self.stderr.ended.wait()
        for transport in self._transports:
            transport.close()


@contextlib.asynccontextmanager
async def stdio_transport(
    launch: Launch, on_process: Callable[[ServerProcess], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK transport of a sandboxed stdio server: starts it, yields its message
    streams, stops it on exit. `on_process` is told of the started process (its
    supervisor watches its exit)."""
    proc = await asyncio.to_thread(start, launch)
    server = ServerProcess(proc, launch.spawn)
    try:
        on_process(server)  # before the watch: an early exit is not missed
        await server.watch()
        reader, writer = await _pipes(server)
        incoming_w, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        outgoing, outgoing_r = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read, reader, incoming_w, server)
            tasks.start_soon(_write, outgoing_r, writer)
            try:
                yield incoming, outgoing
            finally:
                tasks.cancel_scope.cancel()
                for stream in (incoming, incoming_w, outgoing, outgoing_r):
                    await stream.aclose()
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop()


async def _pipes(server: ServerProcess) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    proc = server.proc
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
    server.adopt(out)
    pipe, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop), proc.stdin
    )
    server.adopt(pipe)
    return reader, asyncio.StreamWriter(pipe, protocol, None, loop)


async def _read(reader: asyncio.StreamReader, into: Any, server: ServerProcess) -> None:
    """Each stdout line is one message; EOF or an oversized line ends the connection."""
    async with into:
        try:
            await _read_lines(reader, into, server)
        finally:
            server.lose()


async def _read_lines(reader: asyncio.StreamReader, into: Any, server: ServerProcess) -> None:
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            return  # the server closed stdout (it ended)
        except asyncio.LimitOverrunError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.proc.pid, signal.SIGKILL)
            return
        if not line.strip():
            continue
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError as exc:
            await into.send(exc)
            continue
        await into.send(SessionMessage(message))


async def _write(messages: Any, writer: asyncio.StreamWriter) -> None:
    async with messages:
        async for message in messages:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            try:
                writer.write(data.encode() + b"\n")
                await writer.drain()
            except (ConnectionError, OSError):
                return


def transport_of(launch: Launch, on_process: Callable[[ServerProcess], None]) -> Transport:
    """`stdio_transport` typed as the SDK's `Transport`."""
    transport: Transport = stdio_transport(launch, on_process)
    return transport


__all__ = [
    "MAX_MESSAGE_BYTES",
    "Launch",
    "ServerProcess",
    "server_env",
    "start",
    "transport_of",
    "trusted_repositories",
]
