"""The walls around tools: path boundaries, a minimal environment, output caps and a
subprocess runner that owns its whole process group (SPEC §4, §13)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import re
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from core.errors import ToolDenied, ToolError
from core.tools.base import SandboxSettings, ToolResult, default_temp_root

_READ_CHUNK = 64 * 1024
# After the main process exits, how long we keep reading output still in flight. Then the
# group is killed: background jobs (`sleep 30 &`) never outlive the tool call, and waiting
# for ones that hold our pipes open would stall the agent.
_PIPE_GRACE = 0.5
# SIGKILL cannot be ignored; this only bounds a process stuck in uninterruptible I/O.
_REAP_LIMIT = 5.0


# --- paths -------------------------------------------------------------------------------


def _expand(path: Path | str, base: Path) -> Path:
    """`~`-expanded absolute path (relative paths hang off `base`), not yet resolved."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else base / expanded


def _is_under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def allowed_roots(sandbox: SandboxSettings, *, for_write: bool) -> list[Path]:
    """The resolved roots a file tool may use. Artifacts are readable, never writable."""
    workspace = sandbox.resolved_workspace()
    roots = [workspace, default_temp_root(), *sandbox.allowed_paths]
    if not for_write:
        # Cut outputs point the model at artifacts; it must be able to page through them.
        roots.append(sandbox.resolved_artifacts())
    return [_expand(root, workspace).resolve() for root in roots]


def resolve_path(path: str, sandbox: SandboxSettings, *, for_write: bool) -> Path:
    """Resolve `path` to an absolute, symlink-free path inside the sandbox.

    Relative paths are relative to the workspace. Denied paths beat allowed roots and are
    matched both as written and resolved, so a symlink cannot reach them either.

    Raises:
        ToolDenied: the path is outside every allowed root or inside a denied path.
    """
    workspace = sandbox.resolved_workspace()
    lexical = Path(os.path.normpath(_expand(path, workspace)))
    try:
        # Non-strict resolve follows every existing symlink (dangling ones included) and
        # keeps the not-yet-existing tail, so a file about to be written is checked too.
        resolved = lexical.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop
        raise ToolDenied(f"permission denied: cannot resolve `{path}`: {exc}") from exc
    for denied, forms in _denied_forms(sandbox, workspace):
        if any(_is_under(resolved, form) or _is_under(lexical, form) for form in forms):
            raise ToolDenied(
                f"permission denied: `{path}` resolves to {resolved}, which is inside "
                f"the denied path {denied}"
            )
    roots = allowed_roots(sandbox, for_write=for_write)
    if not any(_is_under(resolved, root) for root in roots):
        names = ", ".join(str(root) for root in roots)
        raise ToolDenied(
            f"permission denied: `{path}` resolves to {resolved}, which is outside the "
            f"allowed roots ({names})"
        )
    return resolved


# Path-looking substrings of a command line: absolute, home- or workspace-relative.
_PATHISH = re.compile(r"(?:~|\$\{?HOME\}?|[\w.-]+)?/[^\s'\"`;|&()<>=]*|~(?=[\s'\"]|$)")


def mentions_denied_path(command: str, sandbox: SandboxSettings) -> Path | None:
    """The first denied path a shell command line names, if any (a heuristic for `bash`,
    whose file access the path walls cannot see; `bash` refuses such commands)."""
    workspace = sandbox.resolved_workspace()
    home = os.path.expanduser("~")
    denied = _denied_forms(sandbox, workspace)
    for match in _PATHISH.finditer(command):
        text = re.sub(r"^(~|\$\{?HOME\}?)", lambda _: home, match.group())
        candidate = Path(os.path.normpath(workspace / text))  # absolute `text` wins the join
        for _, forms in denied:
            if any(_is_under(candidate, form) for form in forms):
                return forms[0]
    return None


def _denied_forms(sandbox: SandboxSettings, workspace: Path) -> list[tuple[Path, tuple[Path, ...]]]:
    """Each denied path as configured, with the forms it is checked in: as written
    (normalised) and with symlinks resolved."""
    forms: list[tuple[Path, tuple[Path, ...]]] = []
    for denied in sandbox.denied_paths:
        written = Path(os.path.normpath(_expand(denied, workspace)))
        forms.append((denied, (written, written.resolve())))
    return forms


# --- environment ---------------------------------------------------------------------------


def tool_env(sandbox: SandboxSettings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a tool: allowlisted host variables plus the tool's declared env."""
    env = {key: os.environ[key] for key in sandbox.env_allowlist if key in os.environ}
    env.update(extra or {})
    return env


# --- output caps ---------------------------------------------------------------------------


def _decode_head(data: bytes) -> str:
    # An incremental decoder without `final` drops a multi-byte character cut in half.
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def _decode_tail(data: bytes) -> str:
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:  # continuation bytes
        skip += 1
    return data[skip:].decode("utf-8", errors="replace")


def cut_notice(cut: int, artifact: Path | None) -> str:
    """The marker put where output was cut."""
    where = f"full output in {artifact}" if artifact else "full output not kept"
    return f"\n…[{cut:,} bytes cut; {where}]…\n"


def _join_cut(head: bytes, tail: bytes, cut: int, artifact: Path | None) -> str:
    return _decode_head(head) + cut_notice(cut, artifact) + _decode_tail(tail)


def cap_output(data: bytes, cap: int, artifact: Path | None = None) -> tuple[str, bool, int]:
    """Decode `data`, keeping head and tail (half of `cap` each) when it is longer.

    Returns:
        (text, truncated, bytes_cut); the notice names `artifact` when given.
    """
    if len(data) <= cap:
        return data.decode("utf-8", errors="replace"), False, 0
    half = cap // 2
    tail = cap - half
    cut = len(data) - half - tail
    return _join_cut(data[:half], data[-tail:], cut, artifact), True, cut


class _CappedStream:
    """Keeps the first and the last cap/2 bytes of a stream in memory; once the stream
    exceeds the cap, everything is also written to an artifact file."""

    def __init__(self, cap: int, artifact: Path) -> None:
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0
        self._artifact_path = artifact
        self._file: BinaryIO | None = None

    def feed(self, data: bytes) -> None:
        if self._file is None and self._total + len(data) > self._head_cap + self._tail_cap:
            # Nothing has been dropped yet, so head + tail is everything read so far.
            self._artifact_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self._artifact_path.open("wb")
            self._file.write(self._head + self._tail)
        if self._file is not None:
            # Small sequential writes to local disk; not worth a thread hop per chunk.
            self._file.write(data)
        self._total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        if len(self._tail) > self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def result(self) -> tuple[str, Path | None]:
        if self._file is None:
            return (self._head + self._tail).decode("utf-8", errors="replace"), None
        cut = self._total - len(self._head) - len(self._tail)
        text = _join_cut(bytes(self._head), bytes(self._tail), cut, self._artifact_path)
        return text, self._artifact_path


# --- processes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
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


def _kill_group(pid: int) -> None:
    # start_new_session made the child a group leader, so pgid == pid and the whole
    # tree (including `sleep 30 &` grandchildren) goes with one signal.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _Collector(asyncio.SubprocessProtocol):
    """Feeds pipe data into the capped streams and reports exit and pipe closure apart.

    A protocol rather than `Process.wait()`: on 3.11 `wait()` only returns once the pipes
    close, which a background grandchild can postpone forever. Callbacks also mean no
    reader tasks that could leak.
    """

    def __init__(self, out: _CappedStream, err: _CappedStream) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._sinks = {1: out, 2: err}
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._sinks[fd].feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _wait(future: asyncio.Future[None], limit: float) -> bool:
    """Wait for `future` without cancelling it; True if it completed in time."""
    done, _pending = await asyncio.wait({future}, timeout=limit)
    return bool(done)


def _artifact_base(artifacts_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return artifacts_dir / f"{stamp}-{secrets.token_hex(4)}"


async def _spawn(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], collector: _Collector
) -> asyncio.SubprocessTransport:
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.subprocess_exec(
            lambda: collector,
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot start `{argv[0]}`: {exc.strerror or exc}") from exc
    return transport


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    # A parameter, not the caller's asyncio.timeout: expiry must kill the process group.
    timeout: float,  # noqa: ASYNC109
    cap: int,
    artifacts_dir: Path,
) -> ProcessResult:
    """Run `argv` (no shell) with stdin closed in its own process group.

    The group is SIGKILLed on timeout and on cancellation (which is re-raised); output
    beyond `cap` bytes per stream is cut to head + tail and kept in full as an artifact.

    Raises:
        ToolError: the program could not be started.
    """
    base = _artifact_base(artifacts_dir)
    out = _CappedStream(cap, base.with_suffix(".stdout.txt"))
    err = _CappedStream(cap, base.with_suffix(".stderr.txt"))
    collector = _Collector(out, err)
    started = time.monotonic()
    transport = await _spawn(argv, cwd, env, collector)
    pid = transport.get_pid()
    timed_out = lingering = False
    try:
        if not await _wait(collector.exited, timeout):
            timed_out = True
            _kill_group(pid)
            await _wait(collector.exited, _REAP_LIMIT)
        duration = time.monotonic() - started
        if not await _wait(collector.pipes_closed, _PIPE_GRACE):
            lingering = not timed_out
        # Whatever is still in the group is an attached leftover; never let it outlive us.
        _kill_group(pid)
    except BaseException:  # cancellation: kill, reap, re-raise
        _kill_group(pid)
        with contextlib.suppress(BaseException):
            await _wait(collector.exited, _REAP_LIMIT)
        raise
    finally:
        transport.close()
        out.close()
        err.close()
    stdout, out_art = out.result()
    stderr, err_art = err.result()
    code = transport.get_returncode()
    return ProcessResult(
        exit_code=code if code is not None else -signal.SIGKILL,
        stdout=stdout,
        stderr=stderr,
        duration=duration,
        timed_out=timed_out,
        artifacts=tuple(a for a in (out_art, err_art) if a is not None),
        lingering_killed=lingering,
    )


def format_observation(result: ProcessResult, *, timeout: float) -> ToolResult:
    """One structured observation for the model: exit code, duration, both streams and
    notes on timeouts and cut output."""
    lines: list[str] = []
    if result.timed_out:
        lines.append(f"error: timed out; the process group was killed after {timeout:g}s")
    lines += [f"exit_code: {result.exit_code}", f"duration: {result.duration:.2f}s"]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        lines.append(f"{name}:\n{text.rstrip(chr(10))}" if text else f"{name}: (empty)")
    if result.lingering_killed:
        lines.append("note: background processes kept the output open and were killed")
    if result.artifacts:
        paths = ", ".join(str(p) for p in result.artifacts)
        lines.append(
            f"note: output was cut; full output in {paths} "
            "(page through it with read_file offset/limit)"
        )
    return ToolResult("\n".join(lines), is_error=result.timed_out or result.exit_code != 0)


async def run_in_workspace(
    argv: list[str],
    sandbox: SandboxSettings,
    *,
    timeout: float,  # noqa: ASYNC109 - the process group's deadline, enforced by run_process
    env: Mapping[str, str] | None = None,
) -> ToolResult:
    """Run `argv` in the workspace under the sandbox's limits; the observation for the model.
    `env`: the tool's own extra variables."""
    workspace = sandbox.resolved_workspace()
    workspace.mkdir(parents=True, exist_ok=True)
    result = await run_process(
        argv,
        cwd=workspace,
        env=tool_env(sandbox, env),
        timeout=timeout,
        cap=sandbox.output_cap_bytes,
        artifacts_dir=sandbox.resolved_artifacts(),
    )
    return format_observation(result, timeout=timeout)
