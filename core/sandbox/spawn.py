"""Entering the sandbox for one spawn: the throwaway thread that drops to the tools' user,
sets `no_new_privs`, enforces a Landlock ruleset and the network filter, and starts the
child, which inherits all of it (see `Spawn`). What the rules are is core/sandbox/jail.py's
business; the rules' meaning is in docs/tools.md."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

from core.records import record
from core.sandbox import landlock, netguard, pidns, seccomp


@record(frozen=True, slots=True)
class RunAs:
    """The unprivileged user root's tools run as."""

    name: str
    uid: int
    gid: int


def count_tasks(uid: int) -> int:
    """Threads whose owner is `uid`, as far as /proc shows them (RLIMIT_NPROC counts
    threads of the real uid)."""
    total = 0
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rsplit(b")", 1)[-1].split()
            total += int(fields[17]) if len(fields) > 17 else 1
    return total


def confine_thread(ruleset: int, run_as: RunAs | None) -> None:
    """Confine the calling thread for good, as a tool's spawning thread is: the tools'
    user (keeping only the DAC-override capabilities) when Parley is root, then
    `no_new_privs` and the Landlock `ruleset`."""
    if run_as is not None:
        keep = (landlock.CAP_DAC_OVERRIDE, landlock.CAP_DAC_READ_SEARCH)
        landlock.drop_thread_to_user(run_as.uid, run_as.gid, keep)
    landlock.set_no_new_privs()
    landlock.restrict_self(ruleset)


@record(slots=True)
class Spawn:
    """One spawn's ruleset, limits, user and PID namespace.

    The sandbox is entered by a throwaway thread, not by the child: Landlock,
    `no_new_privs`, capabilities and (through raw syscalls) the uid are per-thread, and
    a child inherits them from the thread that forks it. So the child can be started with
    vfork and no Python code between fork and exec (a `preexec_fn` forces a full fork,
    which costs ~4 ms in a process of Parley's size). Resource limits are per-process:
    the same thread lowers them on the child right after exec, before the child's own
    start-up (a shell's takes far longer) lets it fork. A PID namespace made by the
    thread (root) is made first, with the call's IPC namespace: they need CAP_SYS_ADMIN,
    which the uid drop takes away. The kernel-surface filter goes on after the network
    filter: stacked, the stricter answer wins.
    """

    ruleset: int
    limits: tuple[tuple[int, int], ...]
    run_as: RunAs | None
    process_budget: int = 0  # processes one call may add (the limit is the count + this)
    pid_namespaces: pidns.PidNamespaces | None = None
    network: netguard.NetGuard | None = None  # the seccomp socket rules
    surface: bytes = b""  # the kernel-surface filter (core/sandbox/surface.py)
    listener: netguard.Listener | None = None  # served while the spawn lasts

    def command(self, argv: Sequence[str]) -> list[str]:
        """The argv to launch for `argv`: under the PID namespace's init when there is
        one."""
        ns = self.pid_namespaces
        return ns.command(argv, self.limits) if ns is not None else list(argv)

    def start(self, launch: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """Run `launch` in a thread confined by this spawn; return its process."""
        limits = dict(self.limits)
        try:
            return self._start(launch, limits.get(resource.RLIMIT_NPROC))
        except BlockingIOError:
            if resource.RLIMIT_NPROC not in limits:
                raise
            # The process count behind the limit was a cached one: count again, once.
            uid = self.run_as.uid if self.run_as else os.getuid()
            return self._start(launch, count_tasks(uid) + self.process_budget)

    def _start(
        self, launch: Callable[[], subprocess.Popen[bytes]], nproc: int | None
    ) -> subprocess.Popen[bytes]:
        box: list[subprocess.Popen[bytes] | BaseException] = []

        def confined() -> None:
            try:
                if self.pid_namespaces is not None and self.pid_namespaces.in_thread:
                    landlock.unshare_call_namespaces()  # the child is PID 1 of its own
                    limits = dict(self.limits)  # address space, or data for MCP servers
                    memory = limits.get(resource.RLIMIT_AS) or limits.get(resource.RLIMIT_DATA)
                    if memory:  # segments are not in a process's address space
                        pidns.cap_shared_memory(memory)
                if self.run_as is not None:
                    keep = (landlock.CAP_DAC_OVERRIDE, landlock.CAP_DAC_READ_SEARCH)
                    landlock.drop_thread_to_user(self.run_as.uid, self.run_as.gid, keep)
                landlock.set_no_new_privs()
                if self.network is not None:  # a retried start replaces the first listener
                    netguard.NetGuard.release(self.listener)
                    self.listener = self.network.install()
                if self.surface:
                    seccomp.install(self.surface, listener=False)
                landlock.restrict_self(self.ruleset)
                proc = _launch_counted(launch, nproc)
                box.append(proc)
                for res, value in self.limits:  # hard limits too: no raising them back
                    _lower(
                        proc.pid,
                        res,
                        value if nproc is None or res != resource.RLIMIT_NPROC else nproc,
                    )
            except BaseException as exc:  # handed to the caller's thread
                box.append(exc)

        thread = threading.Thread(target=confined, name="parley-tool-spawn", daemon=True)
        thread.start()
        thread.join()
        outcome = box[-1]
        if isinstance(outcome, BaseException):
            if box and isinstance(box[0], subprocess.Popen):  # started, then failed: kill it
                with contextlib.suppress(OSError):
                    os.killpg(box[0].pid, signal.SIGKILL)
            raise outcome
        return outcome

    def close(self) -> None:
        os.close(self.ruleset)
        netguard.NetGuard.release(self.listener)
        self.listener = None


_NPROC_LOCK = threading.Lock()


def _launch_counted(
    launch: Callable[[], subprocess.Popen[bytes]], nproc: int | None
) -> subprocess.Popen[bytes]:
    """`launch()` with the process limit already in force in the child.

    The other limits are lowered on the child just after exec, but a fork bomb forks in
    the microseconds before that, and a process forked then keeps no limit. A child
    inherits its parent's limits at fork, so Parley's own soft RLIMIT_NPROC is lowered
    for the spawn and put back after it (under a lock: one spawn at a time). Parley's
    root threads are exempt from it (CAP_SYS_RESOURCE); this thread, dropped to the
    tools' user, is not, and neither is anything its child starts.
    """
    if nproc is None:
        return launch()
    with _NPROC_LOCK:
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        cap = nproc if hard == resource.RLIM_INFINITY else min(nproc, hard)
        lowered = soft == resource.RLIM_INFINITY or cap < soft
        if lowered:
            resource.setrlimit(resource.RLIMIT_NPROC, (cap, hard))
        try:
            return launch()
        finally:
            if lowered:
                resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))


def _lower(pid: int, res: int, value: int) -> None:
    _soft, hard = resource.prlimit(pid, res)
    cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.prlimit(pid, res, (cap, cap))
