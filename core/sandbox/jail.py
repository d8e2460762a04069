"""The wall around every tool subprocess (docs/tools.md): what the kernel enforces.

A `Jail` is built once per configuration. For each spawn it makes a Landlock ruleset in
Parley's process and starts the child from a throwaway thread that (see `Spawn`):

0. makes the child the first process of a PID namespace of its own (core/sandbox/pidns.py),
   so that every process it leads to dies with it, wherever it moved in the tree, in an
   IPC namespace of its own, so that no shared memory or message queue outlives the call;
1. when Parley runs as root, becomes the unprivileged `run_as` user, keeping only the
   DAC-override capabilities as ambient ones (so the workspace stays usable while
   Landlock decides what is reachable) — with no CAP_SYS_PTRACE and another uid, the
   tool cannot read Parley's `/proc/<pid>/environ` or memory, and RLIMIT_NPROC (which
   the kernel never applies to uid 0) holds a fork bomb;
2. sets `no_new_privs` and enforces the ruleset: read-write beneath the run's own
   workspace (its channel's or conversation's, see core/sandbox/site.py), `allowed_paths`
   and the run's scratch dir; read-only its conversation's artifacts; read + execute
   beneath the system dirs (with denied paths carved out); `/dev/null`, `/dev/zero`,
   `/dev/urandom`; nothing else — not `$HOME`, not `/proc`, not Parley's store or
   events, not other runs' scratch, workspaces or artifacts. Parley's configuration
   files stay read-only wherever they are, and a read-only spawn (a read-category tool)
   may write only its scratch dir. From ABI 6 the tool can neither signal nor reach
   abstract sockets of processes outside its domain (Parley, other tool calls); with
   `network = false`, TCP bind/connect are denied (ABI 4). Right after `no_new_privs` it
   installs the seccomp filter of the network mode (core/sandbox/netguard.py), whose
   listener, if any, Parley serves while the spawn lasts, and the kernel-surface filter
   (core/sandbox/surface.py: namespaces, keyrings, bpf, mounts, … denied);
3. resource limits are lowered (CPU seconds, file size, processes, address space, no
   core file);
4. the group reaper (core/sandbox/reaper.py) kills the tool's process group — its PID
   namespace's first process among them — if Parley dies.

The built-in file tools get the same ruleset (`ruleset`) on a thread of their own per
run (core/sandbox/filejail.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from core.errors import ConfigError
from core.sandbox import landlock, netguard, pidns
from core.sandbox.roots import config_entries, make_root, reach_notes
from core.sandbox.settings import SandboxSettings
from core.sandbox.spawn import RunAs, Spawn, confine_thread, count_tasks

__all__ = ["Jail", "MemoryLimit", "RunAs", "Spawn", "confine_thread", "count_tasks"]

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

MemoryLimit = Literal["address_space", "data"]
"""What `max_memory_bytes` limits in a spawn. `address_space` (RLIMIT_AS): every mapping,
reserved or used — what tool calls get. `data` (RLIMIT_DATA): the private writable memory
a process uses (heap, anonymous maps, thread stacks), not address space it only reserves
— what MCP servers get: V8 reserves gigabytes for each WebAssembly memory and would fail
under any address-space limit that still means something (docs/guide/extending.md)."""
_MEMORY_LIMITS = {"address_space": resource.RLIMIT_AS, "data": resource.RLIMIT_DATA}


def _is_under(path: Path, root: Path) -> bool:
    # Lexical, as Path.is_relative_to, on the strings (a tenth of its cost: the plan
    # compares every entry of /etc with every denied path).
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


def _resolved(path: Path | str) -> Path:
    return Path(os.path.expanduser(path)).resolve()


def _carve(
    root: Path, denied: Sequence[Path], rights: int, frozen: Sequence[Path] = ()
) -> list[landlock.Rule]:
    """Rules granting `rights` beneath `root` except beneath any denied path (nothing)
    and any frozen one (read-only): the root itself when none lies inside it, else its
    other entries, recursively. A directory on the way to one may only be listed (a
    right on a directory reaches everything beneath it), so nothing can be created in,
    removed from or renamed into it: a frozen file cannot be replaced either."""
    if any(_is_under(root, d) for d in denied):
        return []
    if any(_is_under(root, f) for f in frozen):
        return [landlock.Rule(root, rights & landlock.READ_ONLY)]
    inside = [p for p in (*denied, *frozen) if _is_under(p, root)]
    if not inside:
        return [landlock.Rule(root, rights)]
    rules = [landlock.Rule(root, landlock.READ_DIR)]
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = Path(entry.path)
            if entry.is_symlink():
                rules += _symlink_target(path, denied, rights, frozen)
            elif entry.is_dir(follow_symlinks=False):
                rules += _carve(path, denied, rights, frozen)
            elif not any(_is_under(path, d) for d in denied):
                read_only = any(_is_under(path, f) for f in frozen)
                granted = rights & landlock.READ_ONLY if read_only else rights
                rules.append(landlock.Rule(path, granted & landlock.FILE_RIGHTS))
    return rules


def _symlink_target(
    link: Path, denied: Sequence[Path], rights: int, frozen: Sequence[Path] = ()
) -> list[landlock.Rule]:
    # Landlock sees the target, not the link. A file target is granted unless it is
    # denied or lives in /proc or /sys (e.g. /etc/resolv.conf -> /run/...), read-only
    # when frozen; a directory target is not (it may be anything) unless another rule
    # already covers it.
    target = link.resolve()
    if not target.is_file() or any(_is_under(target, d) for d in denied):
        return []
    if any(_is_under(target, Path(p)) for p in _NEVER_FOLLOW):
        return []
    if any(_is_under(target, f) for f in frozen):
        rights &= landlock.READ_ONLY
    return [landlock.Rule(target, rights & landlock.FILE_RIGHTS)]


def _surface(net: netguard.NetGuard | None, ns: pidns.PidNamespaces | None) -> bytes:
    """The kernel-surface filter, where seccomp filters are enforced (`net` exists)."""
    if net is None:
        return b""
    from core.sandbox import surface

    flags = ns.unshare_flags if ns is not None else 0
    return surface.program(unshare_flags=flags, private_ipc=_private_ipc(ns))


def _private_ipc(ns: pidns.PidNamespaces | None) -> bool:
    """Each call has an IPC namespace of its own (made with its PID namespace)."""
    return ns is not None and ns.how is not None


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


class Jail:
    """The kernel sandbox for one configuration.

    Raises:
        ConfigError: `sandbox = "required"` on a kernel without Landlock; a writable root
            inside a denied path or Parley's own data; an unknown `run_as` user.
    """

    def __init__(
        self,
        settings: SandboxSettings,
        protected: Iterable[Path] = (),
        config_files: Iterable[Path] = (),
        readable: Iterable[Path] = (),
    ) -> None:
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
        # Parley's configuration: every entry it goes through to read each file (links
        # included) stays as it is, readable and never writable, wherever it lives.
        self.config_paths = [entry for f in config_files for entry in config_entries(f)]
        # Read-only roots of Parley's own besides `read_only_paths` (skill folders).
        self.readable = [_resolved(p) for p in readable]
        self.carved: list[tuple[str, Path, Path]] = []
        self.frozen_in: list[tuple[str, Path, Path]] = []  # config entries inside a root
        self.notes: list[str] = []
        # resolved once: the start-up checks and the plan at the first spawn see the same
        self._denied = [_resolved(d) for d in settings.denied_paths] if self.abi else []
        self._denied += self.protected
        self.run_as = _run_as(settings) if self.abi else None
        self._writable = self._check() if self.abi else []
        user = (self.run_as.uid, self.run_as.gid) if self.run_as else None
        self.net = netguard.guard_for(settings, self.abi, user)  # the socket rules
        self.pid_namespaces = pidns.probe(os.geteuid()) if self.abi else None
        self.surface = _surface(self.net, self.pid_namespaces)  # the kernel-surface filter
        self._system: list[landlock.Rule] | None = None
        self._rules: dict[bool, list[landlock.Rule]] = {}  # by read_only
        self._fds: dict[bool, list[tuple[int, int]]] = {}
        # Each run is granted its own workspace (workspace_scope): its rules, by directory
        # and read_only.
        self._workspaces: OrderedDict[tuple[Path, bool], list[tuple[int, int]]] = OrderedDict()
        self._tasks = (0, 0.0)  # (count, when)
        # Threads of Parley's own that run as the tools' user (the file tools' confined
        # workers): the kernel counts them against the tools' process limit, /proc does
        # not show them under that user, so the limit makes room for them.
        self.own_tasks = 0

    @property
    def enforced(self) -> bool:
        return self.abi > 0

    def _check(self) -> list[Path]:
        """The writable roots, made if missing; raises when one lies in a denied path or
        in Parley's configuration."""
        settings, denied, frozen = self.settings, self._denied, self.config_paths
        writable = [("tools.workspace", settings.resolved_workspace())] + [
            ("tools.allowed_paths", _resolved(p)) for p in settings.allowed_paths
        ]
        self.carved, self.frozen_in = [], []
        for key, root in writable:
            for path in (*denied, *frozen):
                if _is_under(root, path):
                    what = (
                        "Parley's configuration" if path in frozen
                        else "Parley's own data" if path in self.protected
                        else "tools.denied_paths"
                    )  # fmt: skip
                    fix = "move the root out of it" + (
                        "" if path in frozen else ", or remove the denied path"
                    )
                    raise ConfigError(
                        key, f"{root} lies inside {path} ({what}); a tool could never use it", fix
                    )
            self.carved += [(key, root, p) for p in denied if _is_under(p, root)]
            self.frozen_in += [(key, root, p) for p in frozen if _is_under(p, root)]
        owner = (self.run_as.uid, self.run_as.gid) if self.run_as else None
        self.notes = [
            f"{path} has {links} hard links: a tool may write it through another name "
            "inside a writable root; remove the others"
            for path in frozen
            if path.is_file() and not path.is_symlink() and (links := path.stat().st_nlink) > 1
        ]
        for key, root in writable:
            make_root(root, owner)
            if owner is not None:
                self.notes += reach_notes(key, root, *owner)
        return [root for _, root in writable]

    @property
    def rules(self) -> list[landlock.Rule]:
        """What the ruleset grants, planned at the first spawn (the system roots' walk
        costs ~10 ms: a one-shot turn that spawns nothing does not pay it)."""
        return self._plan(read_only=False)

    def _plan(self, *, read_only: bool) -> list[landlock.Rule]:
        """The rules of a spawn; `read_only`: the writable roots may only be read."""
        if read_only in self._rules:
            return self._rules[read_only]
        if self._system is None:
            readable = (
                [Path(p) for p in SYSTEM_ROOTS]
                + [_resolved(p) for p in self.settings.read_only_paths]
                + self.readable
            )
            system: list[landlock.Rule] = []
            for root in readable:
                if root.exists():
                    system += _carve(root.resolve(), self._denied, landlock.READ_ONLY)
            system += [landlock.Rule(Path(d), DEVICE_RIGHTS) for d in DEVICES if Path(d).exists()]
            self._system = system
        rights = landlock.READ_ONLY if read_only else landlock.READ_WRITE
        rules = list(self._system)
        # The first writable root is the workspace root: not granted here, since each run
        # gets only its own workspace beneath it (`_workspace_fds`).
        for root in self._writable[1:]:
            rules += _carve(root, self._denied, rights, self.config_paths)
        self._rules[read_only] = rules
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
        walls = ["files", self._process_wall()]
        if self.abi >= 6:
            walls.append("signals")
        if self.surface:  # core/sandbox/surface.py
            private = _private_ipc(self.pid_namespaces)
            walls.append("kernel surface" + ("" if private else " (no System V IPC)"))
        network = netguard.describe(self.settings.network, self.net, self.abi)
        user = f"; tools run as {self.run_as.name}" if self.run_as else ""
        line = f"sandbox: landlock ABI {self.abi} — {', '.join(walls)}; {network}{user}"
        for key, root, path in self.carved:
            line += (
                f"\n  note: {path} is denied inside {key} {root}: tools cannot create new "
                "entries in the directories leading to it"
            )
        for key, root, path in self.frozen_in:
            line += (
                f"\n  note: {path} (Parley's configuration) is read-only inside {key} "
                f"{root}: tools cannot create or remove entries in the directories leading to it"
            )
        return line + "".join(f"\n  note: {note}" for note in self.notes)

    def _process_wall(self) -> str:
        ns = self.pid_namespaces
        if ns is None or ns.how is None:
            detail = ns.detail if ns is not None else "no PID namespace"
            return f"processes (killed by process group only: {detail})"
        return f"processes ({ns.detail})"

    def _rule_fds(self, read_only: bool = False) -> list[tuple[int, int]]:
        if read_only not in self._fds:
            fds = []
            for rule in self._plan(read_only=read_only):
                try:
                    fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # vanished since the plan; nothing to grant
                fds.append((fd, rule.rights))
            self._fds[read_only] = fds
        return self._fds[read_only]

    def _process_limit(self) -> int:
        uid = self.run_as.uid if self.run_as else os.getuid()
        count, when = self._tasks
        now = time.monotonic()
        if now - when > _COUNT_TTL:
            count = count_tasks(uid)
            self._tasks = (count, now)
        return count + self.settings.max_processes + self.own_tasks

    def _workspace_fds(self, workspace: Path, read_only: bool) -> list[tuple[int, int]]:
        """The rules granting one workspace (carved around denied paths and Parley's
        configuration inside it), kept for the most recently used directories."""
        key = (workspace, read_only)
        fds = self._workspaces.get(key)
        if fds is not None:
            self._workspaces.move_to_end(key)
            return fds
        fds = []
        rights = landlock.READ_ONLY if read_only else landlock.READ_WRITE
        for rule in _carve(workspace, self._denied, rights, self.config_paths):
            with contextlib.suppress(OSError):  # vanished: nothing to grant
                fds.append((os.open(rule.path, os.O_PATH | os.O_CLOEXEC), rule.rights))
        self._workspaces[key] = fds
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
        read_only: bool = False,
        network: bool | None = None,
        readable: Sequence[Path] = (),
    ) -> int:
        """A ruleset fd for one run's places: the shared rules plus its `workspace`
        (default: the root) and `scratch` read-write, and its conversation's `artifacts`
        readable. Only for an enforced jail; the caller closes it.

        Args:
            read_only: the workspace and `allowed_paths` may only be read (read-category
                tools write nowhere but `scratch`).
            network: False denies TCP bind and connect whatever the mode (the file
                tools' thread); None: as the network mode says.
            readable: more files and directories to read (an MCP server's program and
                `read_paths`), denied paths carved out of them.
        """
        root = workspace or self.settings.resolved_workspace()
        places = [*self._rule_fds(read_only), *self._workspace_fds(root, read_only)]
        extra = [rule for path in readable for rule in self._readable(path)]
        handled = netguard.handled_net(
            self.settings.network if network is None else network, self.net
        )
        opened = []
        try:
            for path, rights in (
                (scratch, landlock.READ_WRITE),
                (artifacts, ARTIFACT_RIGHTS),
                *((rule.path, rule.rights) for rule in extra),
            ):
                if path is not None:
                    opened.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
                    places.append((opened[-1], rights))
            return landlock.create_ruleset(self.abi, places, handled_net=handled)
        finally:
            for fd in opened:
                os.close(fd)

    def _readable(self, path: Path) -> list[landlock.Rule]:
        """Read rules for one extra path: a file (unless denied) or a directory carved
        around the denied paths; nothing for a path that does not exist."""
        resolved = _resolved(path)
        if any(_is_under(resolved, d) for d in self._denied):
            return []
        if resolved.is_file():
            return [landlock.Rule(resolved, landlock.READ_ONLY & landlock.FILE_RIGHTS)]
        if resolved.is_dir():
            return _carve(resolved, self._denied, landlock.READ_ONLY)
        return []

    def prepare(
        self,
        scratch: Path,
        *,
        read_only: bool = False,
        workspace: Path | None = None,
        artifacts: Path | None = None,
        max_file_bytes: int | None = None,
        readable: Sequence[Path] = (),
        memory: MemoryLimit = "address_space",
    ) -> Spawn | None:
        """What one spawn needs: the ruleset (see `ruleset`), limits, user and PID
        namespace; None when nothing is enforced. `max_file_bytes` lowers the file-size
        limit for this spawn (a write quota); `readable`: more paths it may read;
        `memory`: what `max_memory_bytes` limits (see `MemoryLimit`). Close the result
        after the spawn."""
        if not self.enforced:
            return None
        ruleset = self.ruleset(
            scratch,
            workspace=workspace,
            artifacts=artifacts,
            read_only=read_only,
            readable=readable,
        )
        return Spawn(
            ruleset,
            self._limits(max_file_bytes, memory),
            self.run_as,
            self.settings.max_processes + self.own_tasks,
            pid_namespaces=self.pid_namespaces,
            network=self.net,
            surface=self.surface,
        )

    def _limits(
        self, max_file_bytes: int | None = None, memory: MemoryLimit = "address_space"
    ) -> tuple[tuple[int, int], ...]:
        s = self.settings
        fsize = s.max_file_bytes
        if max_file_bytes is not None:  # at least 1: 0 would mean no limit below
            fsize = max(1, min(fsize, max_file_bytes) if fsize > 0 else max_file_bytes)
        pairs = [
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, s.max_cpu_seconds),
            (resource.RLIMIT_FSIZE, fsize),
            (_MEMORY_LIMITS[memory], s.max_memory_bytes),
            (resource.RLIMIT_NPROC, self._process_limit() if s.max_processes else 0),
        ]
        return tuple(
            (res, value) for res, value in pairs if value > 0 or res == resource.RLIMIT_CORE
        )

    def close(self) -> None:
        for fds in [*self._fds.values(), *self._workspaces.values()]:
            for fd, _ in fds:
                os.close(fd)
        self._fds = {}
        self._workspaces.clear()
