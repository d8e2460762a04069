"""Tool process groups die with Parley, however Parley dies.

The direct child of each tool call has a parent-death signal, but its own children
(`sleep 600 &`) do not. So Parley keeps a tiny reaper process — started on the first
spawn, in its own session, with an empty environment — and tells it over a pipe which
process groups are live. When Parley dies (even by `kill -9`) the pipe reaches EOF and the
reaper SIGKILLs every group still listed, then exits. A group's leader is the first
process of the call's PID namespace (core/sandbox/pidns.py) where there is one: killing it
kills whatever left the group too (`setsid`, daemons).

A `GroupLedger` (the store) may also record each live group with its start time, so that
a start-up after a crash of both (a reboot of the container, an OOM kill of the
session) still kills what a crashed run left behind (`kill_leftovers`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

_REAPER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin.buffer:
    try:
        pgid = int(line[1:])
    except ValueError:
        continue
    (groups.add if line[:1] == b"+" else groups.discard)(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class GroupLedger(Protocol):
    """Where live tool process groups are recorded (the store)."""

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None: ...

    def tool_group_ended(self, pgid: int) -> None: ...


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 if it is gone); with the
    boot id it tells a leftover group from a new one that reused its number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    fields = stat.rsplit(b")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 else 0


def kill_leftovers(groups: Iterable[tuple[int, int, str]]) -> int:
    """SIGKILL each recorded (pgid, start ticks, boot id) group that is still the same
    group on this boot and not one of this process's. Returns how many were killed."""
    current, killed = boot_id(), 0
    for pgid, ticks, boot in groups:
        if pgid in REAPER.live:
            continue
        if boot == current and ticks and start_ticks(pgid) == ticks:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
                killed += 1
    return killed


class GroupReaper:
    """Keeps the reaper process informed of live tool process groups."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.ledger: GroupLedger | None = None
        self.live: set[int] = set()  # this process's groups
        self._boot = boot_id()
        self._warned = self._registered = False

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _REAPER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={},
                    start_new_session=True,
                )
            except OSError as exc:
                if not self._warned:
                    log.warning("no tool process reaper (%s): tools may outlive a crash", exc)
                    self._warned = True
                return None
            if self._proc is None and not self._registered:
                atexit.register(self.close)
                self._registered = True
            self._proc = proc
        return proc

    def _send(self, line: bytes) -> None:
        with self._lock:
            for _ in range(2):
                proc = self._ensure()
                if proc is None or proc.stdin is None:
                    return
                try:
                    os.write(proc.stdin.fileno(), line)
                    return
                except OSError:  # the reaper died: start another and say it again
                    self._proc = None

    def track(self, pgid: int) -> None:
        self.live.add(pgid)
        self._send(b"+%d\n" % pgid)
        if self.ledger is not None:
            self.ledger.tool_group_started(pgid, start_ticks(pgid), self._boot)

    def untrack(self, pgid: int) -> None:
        self.live.discard(pgid)
        self._send(b"-%d\n" % pgid)
        if self.ledger is not None:
            self.ledger.tool_group_ended(pgid)

    def close(self) -> None:
        """Stop the reaper (it kills whatever is still listed)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


REAPER = GroupReaper()
"""The process-wide reaper: one per Parley process, like the process itself."""
