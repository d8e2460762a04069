"""A PID and an IPC namespace per tool call: no process, and no System V IPC object or
POSIX message queue, that a tool makes outlives the call or is seen by another.

The first process of a PID namespace is its init; when it ends, the kernel kills every
other process in the namespace, however it got there (`setsid -f`, double forks,
`nohup … & disown`, daemons) — a process cannot leave its PID namespace. So each call's
process tree is started as the first process of a namespace of its own, and the existing
ways of ending a call (the process group killed at the end, on timeout, on cancellation,
by the reaper when Parley dies, by the start-up ledger after a crash) all reach every
descendant: they kill that first process.

How the namespace is made:

- A Parley with CAP_SYS_ADMIN (root) calls `unshare(CLONE_NEWPID|CLONE_NEWIPC)` in the
  throwaway spawn thread before it drops to the tools' user (see
  `core.sandbox.spawn.Spawn`): the thread's next child is PID 1 of a new PID namespace and
  inherits the thread's new IPC namespace, whose shared memory the thread caps at the
  call's memory limit. No extra process, ~0.1 ms.
- Any other Parley has util-linux `unshare` make a user namespace (the tool keeps its
  own uid, unmapped, and no capabilities) and a PID and an IPC namespace inside it, with
  `--kill-child` so that the namespace dies with `unshare` (which reports the exit
  status of the command, signals included). Landlock, `no_new_privs` and the resource
  limits are inherited through it: they are set before `unshare` runs.
- Where neither works (no CAP_SYS_ADMIN and no user namespaces: a container's seccomp
  profile, a sysctl), tools fall back to the process-group kill, and the start-up line
  says so, and the kernel-surface filter denies System V IPC and message queues
  (core/sandbox/surface.py), which the calls would otherwise share.

An IPC namespace is freed with the last process in it, and every shared memory segment,
semaphore set and message queue with it.

PID 1 is a small `sh`, not the command: init ignores every signal it has no handler for
(a script's `kill $$` would do nothing), so the command runs as PID 2 with ordinary
signal semantics. `sh` exits with the command's status (128 + N when a signal N ended it,
as a shell reports it), saying on stderr when background processes were still running:
they are killed with it. It also lowers the resource limits before it starts the command
(Parley lowers them on its first process only once that has started, and `unshare`
forks its child at once), so the command never runs without them.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from typing import Literal

from core.records import record
from core.sandbox import landlock

# Runs the command as its child — `exec` in a subshell: a program, found on PATH as exec
# finds it, never a builtin of the same name (sh's `echo` is not /bin/echo) — then exits
# with its status; `kill -0 -1` (a builtin, no process) asks whether anything else is
# still alive in the namespace.
INIT = (
    '(exec "$@"); s=$?; kill -0 -1 2>/dev/null && echo "parley: background processes were '
    'still running when the command ended; they were killed" >&2; exit $s'
)
SHELL = "/bin/sh"
# `ulimit` flags every sh has (dash, and bash as sh), and their units in bytes. The process
# limit needs none: it is in force from the fork (see `core.sandbox.jail._launch_counted`).
_ULIMIT = {
    resource.RLIMIT_CPU: ("-t", 1),
    resource.RLIMIT_FSIZE: ("-f", 512),
    resource.RLIMIT_AS: ("-v", 1024),
    resource.RLIMIT_DATA: ("-d", 1024),  # an MCP server's memory limit (core/sandbox/jail.py)
    resource.RLIMIT_CORE: ("-c", 512),
}
# No uid map: writing one needs /proc, which the sandbox denies. Unmapped, the tool keeps
# its own uid for every permission check (it only sees itself and others as 65534) and
# holds no capability once it execs.
_UNSHARE = ("--user", "--pid", "--ipc", "--fork", "--kill-child", "--")
# The namespace flags util-linux `unshare` passes for `_UNSHARE`, after the filters are in
# force: the one `unshare` the kernel-surface filter lets through (core/sandbox/surface.py).
UNSHARE_FLAGS = landlock.CLONE_NEWUSER | landlock.CLONE_NEWPID | landlock.CLONE_NEWIPC


@record(frozen=True, slots=True)
class PidNamespaces:
    """How this Parley puts each call in a PID namespace; `how` None: it cannot."""

    how: Literal["thread", "unshare"] | None
    detail: str  # for the start-up line: the mechanism, or why there is none
    unshare: str = ""  # util-linux unshare, for `how == "unshare"`

    @property
    def in_thread(self) -> bool:
        return self.how == "thread"

    @property
    def unshare_flags(self) -> int:
        """The `unshare` flags a call's set-up makes after the filters are installed."""
        return UNSHARE_FLAGS if self.how == "unshare" else 0

    def command(self, argv: Sequence[str], limits: Iterable[tuple[int, int]] = ()) -> list[str]:
        """`argv` run as PID 2 under the `sh` init, which first lowers `limits`
        ((resource, value) pairs, soft and hard alike)."""
        if self.how is None:
            return list(argv)
        init = [SHELL, "-c", _ulimits(limits) + INIT, "parley-init", *argv]
        return [self.unshare, *_UNSHARE, *init] if self.how == "unshare" else init


def _ulimits(limits: Iterable[tuple[int, int]]) -> str:
    script = ""
    for res, value in limits:
        if res in _ULIMIT:
            flag, unit = _ULIMIT[res]
            hard = resource.getrlimit(res)[1]  # inherited: never ask for more than it
            capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
            script += f"ulimit {flag} {capped // unit} 2>/dev/null; "
    return script


def _thread_can_unshare() -> str | None:
    """None if a thread may make a PID namespace, else why not."""
    outcome: list[str | None] = []

    def attempt() -> None:  # the namespace is dropped with the thread: it starts nothing
        try:
            landlock.unshare_call_namespaces()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    thread = threading.Thread(target=attempt, name="parley-pidns-probe", daemon=True)
    thread.start()
    thread.join()
    return outcome[0] if outcome else "the probe did not finish"


def _unshare_works(unshare: str) -> str | None:
    try:
        done = subprocess.run(
            [unshare, *_UNSHARE, SHELL, "-c", "exit 0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={},
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


@functools.cache
def probe(euid: int) -> PidNamespaces:
    """What this process can do (cached per effective uid: it does not change)."""
    if not os.path.exists(SHELL):
        return PidNamespaces(None, f"no {SHELL} to be the namespace's init")
    why_not = _thread_can_unshare()
    if why_not is None:
        return PidNamespaces("thread", "PID and IPC namespace per call")
    if euid == 0:  # root without CAP_SYS_ADMIN: a user namespace would lose its uid drop
        return PidNamespaces(None, f"no PID namespace ({why_not})")
    unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if unshare is None:
        return PidNamespaces(None, "no PID namespace (needs CAP_SYS_ADMIN or util-linux unshare)")
    failure = _unshare_works(unshare)
    if failure is not None:
        return PidNamespaces(None, f"no PID namespace (unshare --user --pid --ipc: {failure})")
    return PidNamespaces("unshare", "user+PID+IPC namespace per call", unshare)


SHM_FILES = ("/proc/sys/kernel/shmmax", "/proc/sys/kernel/shmall")


def cap_shared_memory(limit: int) -> None:
    """Cap the System V shared memory of the calling thread's IPC namespace at `limit`
    bytes (segments are not counted in a process's address space, so the memory limit
    alone would not hold them). Best effort: a read-only /proc/sys (some containers)
    leaves the kernel's default; the namespace still ends with the call."""
    pages = max(1, limit // resource.getpagesize())
    for path, value in zip(SHM_FILES, (limit, pages), strict=True):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.write(fd, b"%d" % value)
        except OSError:
            pass
        finally:
            os.close(fd)
