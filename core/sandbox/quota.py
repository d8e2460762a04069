"""Write quotas: what one tool call (`max_call_write_bytes`), and a conversation's calls
and artifacts together (`max_conversation_write_bytes`), may add to their workspace,
scratch dir and artifacts. Going over ends the call with an error for the model; when a
conversation is over, its oldest artifacts are deleted first.

How each part is measured:

- exact: `write_file` (it knows its bytes, checked before writing); the artifacts Parley
  writes for cut output (each chunk is taken from the call's budget before it is
  written); any one file a tool process writes (RLIMIT_FSIZE, lowered to the call's
  budget: the kernel stops the write).
- sampled: the total a tool process adds across files. Every `TICK` seconds Parley reads
  how much of each filesystem under the call's writable roots is used (`statvfs`, one
  call per filesystem for all running calls). When the growth since the call began
  passes its budget, Parley adds up the files under those roots changed since then
  (other programs writing to the same disk do not end the call), and if they too pass
  it, kills the call's process group. A call can overshoot by what it writes between two
  samples; the check at its end catches what a sample missed.
- a conversation's usage is its artifacts (listed from its directory at each call) plus
  the net growth its calls caused (kept in memory; it starts again at zero when Parley
  restarts; a run's scratch dir is credited back when the run ends and it is removed).
  A call's charge is the growth of its filesystems, and past `CHECK_CHARGE` no more than
  its own changed files account for. Old artifacts are deleted, oldest first, to leave
  room for one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from core.errors import ToolError
from core.sandbox.settings import SandboxSettings
from core.sandbox.site import ToolSite

TICK = 0.02
"""Seconds between two samples of the disk use of running calls."""

CHECK_CHARGE = 64 << 10
"""A call whose filesystems grew by more than this is charged only what its own files
account for (other programs writing to the same disk are not its doing)."""

_MARGIN_NS = 50_000_000  # file timestamps come from a coarse clock: look a bit earlier
_USAGE_KEPT = 4096


class WriteQuotaExceeded(ToolError):
    """A write would take a call or its conversation over its cap."""


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


class ConversationUsage:
    """What one conversation's tools hold: its artifacts and the net bytes its calls
    added to workspaces and scratch dirs."""

    def __init__(self, artifacts: Path) -> None:
        self.artifacts = artifacts
        self.counted = False  # whether a conversation cap applies: only then is it counted
        self.written = 0
        self._files: list[tuple[int, str, int]] = []  # (mtime_ns, name, bytes), oldest first

    def scan(self) -> int:
        """The artifacts' bytes, listed afresh (Parley's other writers add to the
        directory too: offloaded results, child runs' answers)."""
        files = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.artifacts) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        files.append((info.st_mtime_ns, entry.name, info.st_size))
        files.sort()
        self._files = files
        return sum(size for _, _, size in files)

    def make_room(self, cap: int, want: int = 0) -> int:
        """Delete the oldest artifacts while fewer than `want` of the conversation's
        `cap` bytes are free; the bytes free then (≤ 0 when its tools' own writes fill
        it: those are never deleted)."""
        total = self.written + self.scan()
        while total > cap - want and self._files:
            _, name, size = self._files.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.artifacts / name)
            total -= size
        return cap - total

    def charge(self, growth: int) -> None:
        """Add a call's net growth (negative: it freed space)."""
        self.written = max(0, self.written + growth)


_USAGE: OrderedDict[Path, ConversationUsage] = OrderedDict()


def usage_of(site: ToolSite) -> ConversationUsage:
    """The usage of the conversation `site` belongs to."""
    found = _USAGE.get(site.artifacts)
    if found is None:
        found = _USAGE[site.artifacts] = ConversationUsage(site.artifacts)
        if len(_USAGE) > _USAGE_KEPT:
            _USAGE.popitem(last=False)
    else:
        _USAGE.move_to_end(site.artifacts)
    return found


def tree_bytes(root: Path, since_ns: int = 0) -> int:
    """Bytes on disk of the regular files beneath `root` (changed since `since_ns`), each
    inode once; symlinks are not followed."""
    return _changed_bytes([root], since_ns)


def _changed_bytes(roots: Iterable[Path], since_ns: int) -> int:
    total, seen = 0, set()
    stack = [str(root) for root in roots]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(info.st_mode) or info.st_ctime_ns < since_ns:
                    continue
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total


def _used(path: str) -> int:
    info = os.statvfs(path)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


class CallQuota:
    """One call's write budget: taken from by its artifact streams, watched while its
    process runs, settled (and charged to the conversation) when it ends."""

    def __init__(
        self, limit: int | None, why: str, usage: ConversationUsage, roots: list[Path]
    ) -> None:
        self.limit = limit  # None: no cap
        self.why = why  # which cap `limit` comes from, for the message
        self.usage = usage
        self.roots = roots
        self.artifact_bytes = 0  # what Parley wrote to artifacts for this call
        self.exceeded: str | None = None  # the error for the model, once over
        self._started = time.time_ns() - _MARGIN_NS
        self._paths: dict[int, str] = {}  # one path per filesystem under the roots
        # With neither cap set (both 0) nothing is measured.
        for root in roots if limit is not None or usage.counted else ():
            with contextlib.suppress(OSError):
                self._paths.setdefault(os.stat(root).st_dev, str(root))
        self._base = {dev: _used(path) for dev, path in self._paths.items()}
        # Artifacts on one of those filesystems show in its growth: not the tools' doing.
        self._artifacts_counted = False
        with contextlib.suppress(OSError):
            self._artifacts_counted = os.stat(usage.artifacts).st_dev in self._paths
        self._others = 0  # growth found to be other writers' (see `_confirmed`)
        self._kill: Callable[[], None] | None = None
        self._checking = False

    @property
    def file_limit(self) -> int | None:
        """The largest file a tool process of this call may write (RLIMIT_FSIZE)."""
        return None if self.limit is None else max(self.limit, 0)

    def take(self, n: int) -> int:
        """Bytes of an `n`-byte artifact chunk that may be written."""
        room = n if self.limit is None else self.limit - self.artifact_bytes
        granted = max(0, min(n, room))
        self.artifact_bytes += granted
        return granted

    def _growth(self, used: dict[int, int] | None = None) -> int:
        used = used if used is not None else {}
        total = 0
        for dev, path in self._paths.items():
            if dev not in used:
                with contextlib.suppress(OSError):
                    used[dev] = _used(path)
            total += used.get(dev, self._base[dev]) - self._base[dev]
        if self._artifacts_counted:
            total -= self.artifact_bytes
        return total - self._others

    def watch(self, kill: Callable[[], None]) -> None:
        """Sample the call's growth while its process runs; `kill` ends it when over."""
        if self.limit is None:
            return
        self._kill = kill
        _ticker().add(self)

    def unwatch(self) -> None:
        self._kill = None
        ticker = _TICKERS.get(asyncio.get_running_loop())
        if ticker is not None:
            ticker.remove(self)

    def sample(self, used: dict[int, int]) -> None:
        """One tick: when the disks grew past the budget, check the call's own files."""
        if self.limit is None or self._checking or self.exceeded is not None:
            return
        growth = self._growth(used)
        if growth + self.artifact_bytes <= self.limit:
            return
        self._checking = True
        task = asyncio.get_running_loop().run_in_executor(
            None, _changed_bytes, self.roots, self._started
        )
        task.add_done_callback(lambda done: self._confirmed(growth, done))

    def _confirmed(self, growth: int, done: asyncio.Future[int]) -> None:
        self._checking = False
        if done.cancelled() or done.exception() is not None:
            return
        changed = done.result()
        if changed + self.artifact_bytes > (self.limit or 0):
            self._over(changed)
            if self._kill is not None:
                self._kill()
        else:  # the rest of the growth was someone else's: look again past it
            self._others += growth - changed

    def _over(self, added: int) -> None:
        self.exceeded = (
            f"write quota: this call added {mib(added + self.artifact_bytes)} to its "
            f"workspace, temp dir and artifacts, and may add {mib(self.limit or 0)} "
            f"({self.why}); its writes were stopped there. Write less, or delete files "
            "you no longer need."
        )

    async def settle(self) -> int:
        """The call's net growth, charged to its conversation; sets `exceeded` if it
        reached its budget (a sample can miss a fast writer)."""
        if not self._paths:
            return 0
        growth = self._growth()
        limit, room = self.limit, (self.limit or 0) - self.artifact_bytes
        if abs(growth) <= CHECK_CHARGE and (limit is None or growth < room):
            self.usage.charge(growth)  # small either way: what the disks say
            return growth
        # The call's own files decide: other programs write to (and free) the same disks.
        # Reaching the budget counts, since the file-size limit stops a file there.
        changed = await asyncio.to_thread(_changed_bytes, self.roots, self._started)
        if limit is not None and changed > 0 and changed >= room and self.exceeded is None:
            self._over(changed)
        # Charged no more than its files hold (appending to a big file adds little),
        # credited only for deleting (writes the disks do not show are others' frees).
        charge = min(changed, growth) if growth >= 0 else (growth if changed == 0 else 0)
        self.usage.charge(charge)
        return charge


def budget(sandbox: SandboxSettings, site: ToolSite) -> tuple[int | None, str]:
    """What a call at `site` may add (None: no cap) and which cap says so: the per-call
    cap, or what is left of its conversation's after deleting its oldest artifacts if
    need be (≤ 0: nothing; the call may still delete)."""
    per_call, per_conv = sandbox.max_call_write_bytes, sandbox.max_conversation_write_bytes
    limit, why = (per_call or None), "tools.max_call_write_bytes"
    if per_conv:
        # Room for one whole call, made by deleting old artifacts: else a conversation
        # at its cap would keep no new output at all.
        left = usage_of(site).make_room(per_conv, min(per_call, per_conv))
        if limit is None or left < limit:
            limit = max(left, 0)
            why = (
                f"what is left of this conversation's {mib(per_conv)} under "
                "tools.max_conversation_write_bytes"
            )
    return limit, why


def call_quota(sandbox: SandboxSettings, site: ToolSite, roots: list[Path]) -> CallQuota:
    """The quota of a tool process's call at `site` writing beneath `roots`."""
    limit, why = budget(sandbox, site)
    usage = usage_of(site)
    usage.counted = sandbox.max_conversation_write_bytes > 0
    return CallQuota(limit, why, usage, roots)


def refuse_write(growth: int, limit: int, why: str) -> WriteQuotaExceeded:
    """The error for a `write_file` of `growth` bytes over `limit` (nothing written)."""
    return WriteQuotaExceeded(
        f"write quota: writing this file adds {mib(growth)}, over the {mib(max(limit, 0))} "
        f"this call may add ({why}); nothing was written. Write less, or delete files you "
        "no longer need first."
    )


class _Ticker:
    """Samples every watched call of one event loop, `TICK` apart, while there are any."""

    def __init__(self) -> None:
        self.quotas: set[CallQuota] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, quota: CallQuota) -> None:
        self.quotas.add(quota)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(
                self._run(), name="parley-write-quota"
            )

    def remove(self, quota: CallQuota) -> None:
        self.quotas.discard(quota)
        if not self.quotas and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        while self.quotas:
            await asyncio.sleep(TICK)
            used: dict[int, int] = {}  # statvfs once per filesystem per tick
            for quota in list(self.quotas):
                quota.sample(used)


_TICKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ticker] = (
    weakref.WeakKeyDictionary()
)


def _ticker() -> _Ticker:
    loop = asyncio.get_running_loop()
    ticker = _TICKERS.get(loop)
    if ticker is None:
        ticker = _TICKERS[loop] = _Ticker()
    return ticker


__all__ = [
    "TICK",
    "CallQuota",
    "ConversationUsage",
    "WriteQuotaExceeded",
    "budget",
    "call_quota",
    "refuse_write",
    "tree_bytes",
    "usage_of",
]
