"""The wall around every tool subprocess (SPEC §4, §13): what the kernel enforces.

A `Jail` is built once per configuration. For each spawn it makes a Landlock ruleset in
Parley's process and starts the child from a throwaway thread that (see `Spawn`):

1. when Parley runs as root, becomes the unprivileged `run_as` user, keeping only the
   DAC-override capabilities as ambient ones (so the workspace stays usable while
   Landlock decides what is reachable) — with no CAP_SYS_PTRACE and another uid, the
   tool cannot read Parley's `/proc/<pid>/environ` or memory, and RLIMIT_NPROC (which
   the kernel never applies to uid 0) holds a fork bomb;
2. sets `no_new_privs` and enforces the ruleset: read-write beneath the run's own
   workspace (its channel's or conversation's, see core/tools/site.py), `allowed_paths`
   and the run's scratch dir; read-only its conversation's artifacts; read + execute
   beneath the system dirs (with denied paths carved out); `/dev/null`, `/dev/zero`,
   `/dev/urandom`; nothing else — not `$HOME`, not `/proc`, not Parley's store or
   events, not other runs' scratch, workspaces or artifacts. From ABI 6
   the tool can neither signal nor reach abstract sockets of processes outside its
   domain (Parley, other tool calls); with `network = false`, TCP bind/connect are
   denied (ABI 4);
3. resource limits are lowered (CPU seconds, file size, processes, address space, no
   core file);
4. the group reaper (core/tools/reaper.py) kills the tool's process group if Parley
   dies.

The built-in file tools get the same ruleset (`ruleset`) on a thread of their own per
run (core/tools/filejail.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from core.tools import landlock
from core.tools.settings import SandboxSettings

SYSTEM_ROOTS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
    "/nix/store", "/snap",
)  # fmt: skip
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_RIGHTS = landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV
_NEVER_FOLLOW = ("/proc", "/sys")  # symlinks in /etc into these are not granted
_COUNT_TTL = 2.0  # seconds a count of the tool user's tasks stays fresh
_WORKSPACES_KEPT = 64  # workspaces whose rules stay open (each holds a few O_PATH fds)
# A conversation's cut outputs: its tools may read them, never change or run them.
ARTIFACT_RIGHTS = landlock.READ_FILE | landlock.READ_DIR


def _is_under(path: Path, root: Path) -> bool:
    # Lexical, as Path.is_relative_to, on the strings (a tenth of its cost: the plan
    # compares every entry of /etc with every denied path).
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def _resolved(path: Path | str) -> Path:
    return Path(os.path.expanduser(path)).resolve()


def _carve(root: Path, denied: Sequence[Path], rights: int) -> list[landlock.Rule]:
    """Rules granting `rights` beneath `root` except beneath any denied path: the root
    itself when nothing denied lies inside it, else its other entries, recursively. A
    directory on the way to a denied path may only be listed (a right on a directory
    reaches everything beneath it, the denied path included), so nothing new can be
    created directly in it."""
    if any(_is_under(root, d) for d in denied):
        return []
    inside = [d for d in denied if _is_under(d, root)]
    if not inside:
        return [landlock.Rule(root, rights)]
    rules = [landlock.Rule(root, landlock.READ_DIR)]
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = Path(entry.path)
            if entry.is_symlink():
                rules += _symlink_target(path, denied, rights)
            elif entry.is_dir(follow_symlinks=False):
                rules += _carve(path, denied, rights)
            elif not any(_is_under(path, d) for d in denied):
                rules.append(landlock.Rule(path, rights & landlock.FILE_RIGHTS))
    return rules


def _symlink_target(link: Path, denied: Sequence[Path], rights: int) -> list[landlock.Rule]:
    # Landlock sees the target, not the link. A file target is granted unless it is
    # denied or lives in /proc or /sys (e.g. /etc/resolv.conf -> /run/...); a directory
    # target is not (it may be anything) unless another rule already covers it.
    target = link.resolve()
    if not target.is_file() or any(_is_under(target, d) for d in denied):
        return []
    if any(_is_under(target, Path(p)) for p in _NEVER_FOLLOW):
        return []
    return [landlock.Rule(target, rights & landlock.FILE_RIGHTS)]


@dataclass(frozen=True, slots=True)
class RunAs:
    """The unprivileged user root's tools run as."""

    name: str
    uid: int
    gid: int


def _run_as(settings: SandboxSettings) -> RunAs | None:
    if os.geteuid() != 0 or not settings.run_as or not landlock.can_change_thread_user():
        return None
    try:
        entry = pwd.getpwnam(settings.run_as)
    except KeyError:
        try:
            entry = pwd.getpwuid(int(settings.run_as))
        except (KeyError, ValueError):
            raise ConfigError(
                "tools.run_as",
                f"no user `{settings.run_as}` on this machine",
                'name an existing unprivileged user (e.g. "nobody"), or "" to keep root',
            ) from None
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


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


class Jail:
    """The kernel sandbox for one configuration.

    Raises:
        ConfigError: `sandbox = "required"` on a kernel without Landlock; a writable root
            inside a denied path or Parley's own data; an unknown `run_as` user.
    """

    def __init__(self, settings: SandboxSettings, protected: Iterable[Path] = ()) -> None:
        self.settings = settings
        self.abi = 0 if settings.sandbox == "off" else landlock.abi_version()
        if settings.sandbox == "required" and self.abi == 0:
            raise ConfigError(
                "tools.sandbox",
                "`required`, but this kernel offers no Landlock (Linux 5.13+ with "
                "landlock in the `lsm=` list)",
                'use a kernel with Landlock, or set sandbox = "auto" to run tools unconfined',
            )
        self.protected = [_resolved(p) for p in (settings.artifacts_dir, *protected)]
        self.carved: list[tuple[str, Path, Path]] = []
        # resolved once: the start-up checks and the plan at the first spawn see the same
        self._denied = [_resolved(d) for d in settings.denied_paths] if self.abi else []
        self._denied += self.protected
        self._writable = self._check() if self.abi else []
        self._rules: list[landlock.Rule] | None = None if self.abi else []
        self.run_as = _run_as(settings) if self.abi else None
        self._fds: list[tuple[int, int]] | None = None
        # Each run is granted its own workspace (workspace_scope): its rules, by directory.
        self._workspaces: OrderedDict[Path, list[tuple[int, int]]] = OrderedDict()
        self._tasks = (0, 0.0)  # (count, when)
        # Threads of Parley's own that run as the tools' user (the file tools' confined
        # workers): the kernel counts them against the tools' process limit, /proc does
        # not show them under that user, so the limit makes room for them.
        self.own_tasks = 0

    @property
    def enforced(self) -> bool:
        return self.abi > 0

    def _check(self) -> list[Path]:
        """The writable roots, made if missing; raises when one lies in a denied path."""
        settings, denied = self.settings, self._denied
        writable = [("tools.workspace", settings.resolved_workspace())] + [
            ("tools.allowed_paths", _resolved(p)) for p in settings.allowed_paths
        ]
        self.carved = []
        for key, root in writable:
            for path in denied:
                if _is_under(root, path):
                    what = "Parley's own data" if path in self.protected else "tools.denied_paths"
                    raise ConfigError(
                        key,
                        f"{root} lies inside {path} ({what}); a tool could never use it",
                        "move the root out of it, or remove the denied path",
                    )
                if _is_under(path, root):
                    self.carved.append((key, root, path))
        for _, root in writable:
            root.mkdir(parents=True, exist_ok=True)
        return [root for _, root in writable]

    @property
    def rules(self) -> list[landlock.Rule]:
        """What the ruleset grants, planned at the first spawn (the system roots' walk
        costs ~10 ms: a one-shot turn that spawns nothing does not pay it)."""
        if self._rules is None:
            self._rules = self._plan()
        return self._rules

    def _plan(self) -> list[landlock.Rule]:
        rules: list[landlock.Rule] = []
        readable = [Path(p) for p in SYSTEM_ROOTS] + [
            _resolved(p) for p in self.settings.read_only_paths
        ]
        for root in readable:
            if root.exists():
                rules += _carve(root.resolve(), self._denied, landlock.READ_ONLY)
        # The first writable root is the workspace root: not granted here, since each run
        # gets only its own workspace beneath it (`_workspace_fds`).
        for root in self._writable[1:]:
            rules += _carve(root, self._denied, landlock.READ_WRITE)
        rules += [landlock.Rule(Path(d), DEVICE_RIGHTS) for d in DEVICES if Path(d).exists()]
        return rules

    def describe(self) -> str:
        """One line for start-up and /status: what is enforced."""
        if self.settings.sandbox == "off":
            return 'sandbox: off (tools.sandbox = "off") — tools run unconfined'
        if not self.enforced:
            return (
                "sandbox: NOT ENFORCED — this kernel has no Landlock; tools run unconfined "
                '(set tools.sandbox = "required" to refuse to start instead)'
            )
        walls = ["files", "processes"]
        if self.abi >= 6:
            walls.append("signals")
        network = "network open" if self.settings.network else "network closed (TCP)"
        if not self.settings.network and self.abi < 4:
            network = "network open (this kernel cannot close it)"
        user = f"; tools run as {self.run_as.name}" if self.run_as else ""
        line = f"sandbox: landlock ABI {self.abi} — {', '.join(walls)}; {network}{user}"
        for key, root, path in self.carved:
            line += (
                f"\n  note: {path} is denied inside {key} {root}: tools cannot create new "
                "entries in the directories leading to it"
            )
        return line

    def _rule_fds(self) -> list[tuple[int, int]]:
        if self._fds is None:
            fds = []
            for rule in self.rules:
                try:
                    fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # vanished since the plan; nothing to grant
                fds.append((fd, rule.rights))
            self._fds = fds
        return self._fds

    def _process_limit(self) -> int:
        uid = self.run_as.uid if self.run_as else os.getuid()
        count, when = self._tasks
        now = time.monotonic()
        if now - when > _COUNT_TTL:
            count = count_tasks(uid)
            self._tasks = (count, now)
        return count + self.settings.max_processes + self.own_tasks

    def _workspace_fds(self, workspace: Path) -> list[tuple[int, int]]:
        """The rules granting one workspace read-write (carved around denied paths
        inside it), kept for the most recently used directories."""
        fds = self._workspaces.get(workspace)
        if fds is not None:
            self._workspaces.move_to_end(workspace)
            return fds
        fds = []
        for rule in _carve(workspace, self._denied, landlock.READ_WRITE):
            with contextlib.suppress(OSError):  # vanished: nothing to grant
                fds.append((os.open(rule.path, os.O_PATH | os.O_CLOEXEC), rule.rights))
        self._workspaces[workspace] = fds
        if len(self._workspaces) > _WORKSPACES_KEPT:
            for fd, _ in self._workspaces.popitem(last=False)[1]:
                os.close(fd)
        return fds

    def ruleset(
        self,
        scratch: Path | None,
        *,
        workspace: Path | None = None,
        artifacts: Path | None = None,
        network: bool | None = None,
    ) -> int:
        """A ruleset fd for one run's places: the shared rules plus its `workspace`
        (default: the root) and `scratch` read-write, and its conversation's `artifacts`
        readable. Only for an enforced jail; the caller closes it."""
        places = [*self._workspace_fds(workspace or self.settings.resolved_workspace())]
        opened = []
        try:
            for path, rights in ((scratch, landlock.READ_WRITE), (artifacts, ARTIFACT_RIGHTS)):
                if path is not None:
                    opened.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
                    places.append((opened[-1], rights))
            return landlock.create_ruleset(
                self.abi,
                [*self._rule_fds(), *places],
                network=self.settings.network if network is None else network,
            )
        finally:
            for fd in opened:
                os.close(fd)

    def prepare(
        self,
        scratch: Path,
        *,
        workspace: Path | None = None,
        artifacts: Path | None = None,
        max_file_bytes: int | None = None,
    ) -> Spawn | None:
        """What one spawn needs: the ruleset (see `ruleset`), limits and user; None
        when nothing is enforced. `max_file_bytes` lowers the file-size limit for this
        spawn (a write quota). Close the result after the spawn."""
        if not self.enforced:
            return None
        ruleset = self.ruleset(scratch, workspace=workspace, artifacts=artifacts)
        limits = self._limits(max_file_bytes)
        budget = self.settings.max_processes + self.own_tasks
        return Spawn(ruleset, limits, self.run_as, budget)

    def _limits(self, max_file_bytes: int | None = None) -> tuple[tuple[int, int], ...]:
        s = self.settings
        fsize = s.max_file_bytes
        if max_file_bytes is not None:  # at least 1: 0 would mean no limit below
            fsize = max(1, min(fsize, max_file_bytes) if fsize > 0 else max_file_bytes)
        pairs = [
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, s.max_cpu_seconds),
            (resource.RLIMIT_FSIZE, fsize),
            (resource.RLIMIT_AS, s.max_memory_bytes),
            (resource.RLIMIT_NPROC, self._process_limit() if s.max_processes else 0),
        ]
        return tuple(
            (res, value) for res, value in pairs if value > 0 or res == resource.RLIMIT_CORE
        )

    def close(self) -> None:
        for fd, _ in self._fds or ():
            os.close(fd)
        self._fds = None
        for fds in self._workspaces.values():
            for fd, _ in fds:
                os.close(fd)
        self._workspaces.clear()


def confine_thread(ruleset: int, run_as: RunAs | None) -> None:
    """Confine the calling thread for good, as a tool's spawning thread is: the tools'
    user (keeping only the DAC-override capabilities) when Parley is root, then
    `no_new_privs` and the Landlock `ruleset`."""
    if run_as is not None:
        keep = (landlock.CAP_DAC_OVERRIDE, landlock.CAP_DAC_READ_SEARCH)
        landlock.drop_thread_to_user(run_as.uid, run_as.gid, keep)
    landlock.set_no_new_privs()
    landlock.restrict_self(ruleset)


@dataclass(slots=True)
class Spawn:
    """One spawn's ruleset, limits and user.

    The sandbox is entered by a throwaway thread, not by the child: Landlock,
    `no_new_privs`, capabilities and (through raw syscalls) the uid are per-thread, and
    a child inherits them from the thread that forks it. So the child can be started with
    vfork and no Python code between fork and exec (a `preexec_fn` forces a full fork,
    which costs ~4 ms in a process of Parley's size). Resource limits are per-process:
    the same thread lowers them on the child right after exec, before the child's own
    start-up (a shell's takes far longer) lets it fork.
    """

    ruleset: int
    limits: tuple[tuple[int, int], ...]
    run_as: RunAs | None
    process_budget: int = 0  # processes one call may add (the limit is the count + this)

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
                if self.run_as is not None:
                    keep = (landlock.CAP_DAC_OVERRIDE, landlock.CAP_DAC_READ_SEARCH)
                    landlock.drop_thread_to_user(self.run_as.uid, self.run_as.gid, keep)
                landlock.set_no_new_privs()
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
