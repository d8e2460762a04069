"""A subprocess runner that owns its whole process group (docs/tools.md): stdin closed,
output capped per stream, the group killed on timeout, on cancellation and, through the
reaper, if Parley dies. Inside the sandbox the group's leader is also the first process
of the call's PID namespace, so the kill reaches processes that left the group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ToolError
from core.records import record
from core.sandbox.outputcap import CappedStream
from core.sandbox.reaper import REAPER
from core.sandbox.spawn import Spawn

if TYPE_CHECKING:
    from core.sandbox.quota import CallQuota

# After the main process exits, how long we keep reading output still in flight. Then the
# group is killed: background jobs (`sleep 30 &`) never outlive the tool call, and waiting
# for ones that hold our pipes open would stall the agent.
_PIPE_GRACE = 0.5
# SIGKILL cannot be ignored; this only bounds a process stuck in uninterruptible I/O.
_REAP_LIMIT = 5.0


@record(frozen=True, slots=True)
class ProcessResult:
    """What a finished (or killed) process printed; each stream already capped."""

    exit_code: int  # negative: killed by that signal
    stdout: str
    stderr: str
    duration: float
    timed_out: bool
    artifacts: tuple[Path, ...] = ()
    lingering_killed: bool = False  # background children kept the pipes open

    @property
    def truncated(self) -> bool:
        return bool(self.artifacts)

    @property
    def artifact(self) -> Path | None:
        return self.artifacts[0] if self.artifacts else None


@record(frozen=True, slots=True)
class _Ending:
    """How the wait for a process ended."""

    timed_out: bool
    exited_at: float  # time.monotonic() once the process had exited or been killed
    lingering: bool  # background children kept the pipes open past the grace period


def _kill_group(pid: int) -> None:
    # start_new_session made the child a group leader, so pgid == pid and the whole
    # tree (including `sleep 30 &` grandchildren) goes with one signal.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _PipeReader(asyncio.Protocol):
    """Feeds one pipe into its capped stream and tells the watch when it closes."""

    def __init__(self, sink: CappedStream, watch: _Watch, fd: int) -> None:
        self._sink, self._watch, self._fd = sink, watch, fd

    def data_received(self, data: bytes) -> None:
        self._sink.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._watch.pipe_closed(self._fd)


class _Watch:
    """Reports a child's exit (through a pidfd, no watcher thread) and the closing of its
    pipes apart: a background grandchild can hold the pipes open long after the exit."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}
        self._proc = proc
        self._pidfd = os.pidfd_open(proc.pid)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        if self._proc.poll() is not None and not self.exited.done():
            self.exited.set_result(None)
            self.close()

    def pipe_closed(self, fd: int) -> None:
        self._open.discard(fd)
        if not self._open and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def close(self) -> None:
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1


async def _wait(future: asyncio.Future[None], limit: float) -> bool:
    """Wait for `future` without cancelling it; True if it completed in time."""
    done, _pending = await asyncio.wait({future}, timeout=limit)
    return bool(done)


def _artifact_base(artifacts_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return artifacts_dir / f"{stamp}-{secrets.token_hex(4)}"


def _check_program(name: str, cwd: Path, env: Mapping[str, str]) -> None:
    """Raise ToolError when no `name` exists where exec would look for it (the PATH of
    `env`; a name with a slash: from `cwd`): under a PID namespace's init a missing
    program would otherwise be only the init's exit status 127."""
    if "/" in name:
        found = os.path.exists(cwd / name)
    else:
        found = shutil.which(name, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise ToolError(f"cannot start `{name}`: No such file or directory")


def _launch(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], spawn: Spawn | None
) -> subprocess.Popen[bytes]:
    if spawn is not None:
        _check_program(argv[0], cwd, env)
    command = list(argv) if spawn is None else spawn.command(argv)

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    try:
        return launch() if spawn is None else spawn.start(launch)
    except OSError as exc:
        raise ToolError(f"cannot start `{argv[0]}`: {exc.strerror or exc}") from exc


async def _connect(
    proc: subprocess.Popen[bytes], out: CappedStream, err: CappedStream
) -> tuple[_Watch, list[asyncio.BaseTransport]]:
    loop = asyncio.get_running_loop()
    watch = _Watch(proc)
    transports: list[asyncio.BaseTransport] = []
    for fd, pipe, sink in ((1, proc.stdout, out), (2, proc.stderr, err)):
        transport, _ = await loop.connect_read_pipe(
            lambda sink=sink, fd=fd: _PipeReader(sink, watch, fd),  # type: ignore[misc]
            pipe,
        )
        transports.append(transport)
    return watch, transports


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    # A parameter, not the caller's asyncio.timeout: expiry must kill the process group.
    timeout: float,  # noqa: ASYNC109
    cap: int,
    artifacts_dir: Path,
    spawn: Spawn | None = None,
    quota: CallQuota | None = None,
) -> ProcessResult:
    """Run `argv` (no shell) with stdin closed in its own process group.

    The group is SIGKILLed on timeout and on cancellation (which is re-raised), and by
    the reaper if Parley dies; output beyond `cap` bytes per stream is cut to head +
    tail and kept in full as an artifact. `spawn` confines the process (the sandbox);
    `quota` bounds the artifacts and ends the group when the call writes too much.

    Raises:
        ToolError: the program could not be started.
    """
    base = _artifact_base(artifacts_dir)
    out = CappedStream(cap, base.with_suffix(".stdout.txt"), quota)
    err = CappedStream(cap, base.with_suffix(".stderr.txt"), quota)
    started = time.monotonic()
    proc = _launch(argv, cwd, env, spawn)
    pid = proc.pid
    REAPER.track(pid)
    transports: list[asyncio.BaseTransport] = []
    if quota is not None:
        quota.watch(lambda: _kill_group(pid))
    try:
        watch, transports = await _connect(proc, out, err)
        ending = await _await_exit(pid, watch, timeout)
        # Whatever is still in the group is an attached leftover; never let it outlive us.
        _kill_group(pid)
    except BaseException:  # cancellation: kill, reap, re-raise
        _kill_group(pid)
        with contextlib.suppress(BaseException):
            await asyncio.to_thread(proc.wait, _REAP_LIMIT)
        raise
    finally:
        if quota is not None:
            quota.unwatch()
        REAPER.untrack(pid)
        for transport in transports:
            transport.close()
        out.close()
        err.close()
    return _collect(proc, out, err, ending, started)


async def _await_exit(pid: int, watch: _Watch, limit: float) -> _Ending:
    """Wait for the exit (killing the group after `limit` seconds), then briefly for the
    pipes."""
    timed_out = lingering = False
    try:
        if not await _wait(watch.exited, limit):
            timed_out = True
            _kill_group(pid)
            await _wait(watch.exited, _REAP_LIMIT)
        exited_at = time.monotonic()
        if not await _wait(watch.pipes_closed, _PIPE_GRACE):
            lingering = not timed_out
    finally:
        watch.close()
    return _Ending(timed_out, exited_at, lingering)


def _collect(
    proc: subprocess.Popen[bytes],
    out: CappedStream,
    err: CappedStream,
    ending: _Ending,
    started: float,
) -> ProcessResult:
    stdout, out_art = out.result()
    stderr, err_art = err.result()
    code = proc.poll()
    return ProcessResult(
        exit_code=code if code is not None else -signal.SIGKILL,
        stdout=stdout,
        stderr=stderr,
        duration=ending.exited_at - started,
        timed_out=ending.timed_out,
        artifacts=tuple(a for a in (out_art, err_art) if a is not None),
        lingering_killed=ending.lingering,
    )
