"""The walls around tools: path boundaries, a minimal environment, output caps and a
subprocess runner that owns its whole process group (SPEC §4, §13)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from core.errors import ToolDenied, ToolError
from core.tools.base import ToolContext, ToolResult
from core.tools.jail import Jail, Spawn
from core.tools.reaper import REAPER
from core.tools.settings import SandboxSettings, default_temp_root

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


def _prefixes(roots: Iterable[Path]) -> tuple[str, ...]:
    """Each root as a string ending in one "/": `p + "/"` starts with one of them exactly
    when `p` is that root or inside it (one C call per check; pathlib's is ~40× slower)."""
    return tuple(str(root).rstrip("/") + "/" for root in roots)


@dataclass(frozen=True, slots=True)
class PathRules:
    """The file tools' boundaries, resolved once per configuration (SPEC §4)."""

    workspace: Path
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    # Each denied path as configured, with the forms it is checked in: as written
    # (normalised) and with symlinks resolved.
    denied: tuple[tuple[Path, tuple[Path, ...]], ...]
    # The same as "/"-terminated strings, for the per-call checks (see `_prefixes`).
    _workspace: str = ""
    _read: tuple[str, ...] = ()
    _write: tuple[str, ...] = ()
    _denied: tuple[str, ...] = ()

    @classmethod
    def of(cls, sandbox: SandboxSettings) -> PathRules:
        """The rules of `sandbox`, computed on first use and kept with the settings."""
        rules = sandbox._cache.get("paths")
        if rules is None:
            rules = sandbox._cache["paths"] = cls._compute(sandbox)
        assert isinstance(rules, PathRules)
        return rules

    @classmethod
    def _compute(cls, sandbox: SandboxSettings) -> PathRules:
        workspace = sandbox.resolved_workspace()
        write = [workspace, default_temp_root(), *sandbox.allowed_paths]
        write_roots = tuple(_expand(root, workspace).resolve() for root in write)
        # Cut outputs point the model at artifacts; it must be able to page through them.
        read_roots = (*write_roots, sandbox.resolved_artifacts())
        denied = []
        for path in sandbox.denied_paths:
            written = Path(os.path.normpath(_expand(path, workspace)))
            denied.append((path, (written, written.resolve())))
        return cls(
            workspace,
            read_roots,
            write_roots,
            tuple(denied),
            str(workspace),
            _prefixes(read_roots),
            _prefixes(write_roots),
            _prefixes(form for _, forms in denied for form in forms),
        )


def allowed_roots(sandbox: SandboxSettings, *, for_write: bool) -> list[Path]:
    """The resolved roots a file tool may use. Artifacts are readable, never writable."""
    rules = PathRules.of(sandbox)
    return list(rules.write_roots if for_write else rules.read_roots)


def resolve_path(path: str, sandbox: SandboxSettings, *, for_write: bool) -> Path:
    """Resolve `path` to an absolute, symlink-free path inside the sandbox.

    Relative paths are relative to the workspace. Denied paths beat allowed roots and are
    matched both as written and resolved, so a symlink cannot reach them either.

    Raises:
        ToolDenied: the path is outside every allowed root or inside a denied path.
    """
    rules = PathRules.of(sandbox)
    lexical = os.path.normpath(os.path.join(rules._workspace, os.path.expanduser(path)))
    try:
        resolved = os.path.realpath(lexical, strict=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink loop
            raise ToolDenied(f"permission denied: cannot resolve `{path}`: {exc}") from exc
        # Non-strict realpath follows every existing symlink (dangling ones included) and
        # keeps the not-yet-existing tail, so a file about to be written is checked too.
        resolved = os.path.realpath(lexical)
    probe, lexical_probe = resolved.rstrip("/") + "/", lexical.rstrip("/") + "/"
    if probe.startswith(rules._denied) or lexical_probe.startswith(rules._denied):
        denied = next(  # which one, for the message
            name
            for name, forms in rules.denied
            if any(p.startswith(_prefixes(forms)) for p in (probe, lexical_probe))
        )
        raise ToolDenied(
            f"permission denied: `{path}` resolves to {resolved}, which is inside "
            f"the denied path {denied}"
        )
    roots = rules._write if for_write else rules._read
    if not probe.startswith(roots):
        names = ", ".join(root.rstrip("/") or "/" for root in roots)
        raise ToolDenied(
            f"permission denied: `{path}` resolves to {resolved}, which is outside the "
            f"allowed roots ({names})"
        )
    return Path(resolved)


# Path-looking substrings of a command line: absolute, home- or workspace-relative.
_PATHISH = re.compile(r"(?:~|\$\{?HOME\}?|[\w.-]+)?/[^\s'\"`;|&()<>=]*|~(?=[\s'\"]|$)")


def mentions_denied_path(command: str, sandbox: SandboxSettings) -> Path | None:
    """The first denied path a shell command line names, if any: a seatbelt for `bash`
    (the kernel sandbox is the wall; this only catches the obvious spelling early)."""
    rules = PathRules.of(sandbox)
    home = os.path.expanduser("~")
    for match in _PATHISH.finditer(command):
        text = re.sub(r"^(~|\$\{?HOME\}?)", lambda _: home, match.group())
        candidate = Path(os.path.normpath(rules.workspace / text))  # absolute `text` wins
        for _, forms in rules.denied:
            if any(_is_under(candidate, form) for form in forms):
                return forms[0]
    return None


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


class _PipeReader(asyncio.Protocol):
    """Feeds one pipe into its capped stream and tells the watch when it closes."""

    def __init__(self, sink: _CappedStream, watch: _Watch, fd: int) -> None:
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


def _launch(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], spawn: Spawn | None
) -> subprocess.Popen[bytes]:
    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
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
    proc: subprocess.Popen[bytes], out: _CappedStream, err: _CappedStream
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
) -> ProcessResult:
    """Run `argv` (no shell) with stdin closed in its own process group.

    The group is SIGKILLed on timeout and on cancellation (which is re-raised), and by
    the reaper if Parley dies; output beyond `cap` bytes per stream is cut to head +
    tail and kept in full as an artifact. `spawn` confines the process (the sandbox).

    Raises:
        ToolError: the program could not be started.
    """
    base = _artifact_base(artifacts_dir)
    out = _CappedStream(cap, base.with_suffix(".stdout.txt"))
    err = _CappedStream(cap, base.with_suffix(".stderr.txt"))
    started = time.monotonic()
    proc = _launch(argv, cwd, env, spawn)
    pid = proc.pid
    REAPER.track(pid)
    transports: list[asyncio.BaseTransport] = []
    timed_out = lingering = False
    try:
        watch, transports = await _connect(proc, out, err)
        try:
            if not await _wait(watch.exited, timeout):
                timed_out = True
                _kill_group(pid)
                await _wait(watch.exited, _REAP_LIMIT)
            duration = time.monotonic() - started
            if not await _wait(watch.pipes_closed, _PIPE_GRACE):
                lingering = not timed_out
        finally:
            watch.close()
        # Whatever is still in the group is an attached leftover; never let it outlive us.
        _kill_group(pid)
    except BaseException:  # cancellation: kill, reap, re-raise
        _kill_group(pid)
        with contextlib.suppress(BaseException):
            await asyncio.to_thread(proc.wait, _REAP_LIMIT)
        raise
    finally:
        REAPER.untrack(pid)
        for transport in transports:
            transport.close()
        out.close()
        err.close()
    stdout, out_art = out.result()
    stderr, err_art = err.result()
    code = proc.poll()
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
    failed = result.timed_out or result.exit_code != 0
    return ToolResult("\n".join(lines), is_error=failed, artifacts=result.artifacts)


def jail_of(ctx: ToolContext) -> Jail:
    """The context's jail, else one built from its settings (kept with them)."""
    if ctx.jail is not None:
        return ctx.jail
    jail = ctx.sandbox._cache.get("jail")
    if jail is None:
        jail = ctx.sandbox._cache["jail"] = Jail(ctx.sandbox)
    assert isinstance(jail, Jail)
    return jail


@contextlib.contextmanager
def _scratch(ctx: ToolContext) -> Iterator[Path]:
    """The run's scratch dir, or a fresh one for this call alone (removed after)."""
    if ctx.scratch is not None:
        ctx.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        yield ctx.scratch
        return
    root = default_temp_root() / "calls"
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_in_workspace(
    argv: list[str],
    ctx: ToolContext,
    *,
    timeout: float,  # noqa: ASYNC109 - the process group's deadline, enforced by run_process
    env: Mapping[str, str] | None = None,
) -> ToolResult:
    """Run `argv` in the workspace inside the kernel sandbox; the observation for the
    model. `env`: the tool's own extra variables."""
    sandbox = ctx.sandbox
    workspace = sandbox.resolved_workspace()
    workspace.mkdir(parents=True, exist_ok=True)
    jail = jail_of(ctx)
    with _scratch(ctx) as scratch:
        variables = tool_env(sandbox, {**ctx.env, **(env or {})})
        variables["TMPDIR"] = str(scratch)
        if jail.enforced:  # the real home is out of reach; give tools one they can use
            variables["HOME"] = str(scratch)
        spawn = jail.prepare(scratch)
        try:
            result = await run_process(
                argv,
                cwd=ctx.cwd or workspace,
                env=variables,
                timeout=timeout,
                cap=sandbox.output_cap_bytes,
                artifacts_dir=sandbox.resolved_artifacts(),
                spawn=spawn,
            )
        finally:
            if spawn is not None:
                spawn.close()
    return format_observation(result, timeout=timeout)
