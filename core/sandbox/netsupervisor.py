"""The supervisor of tools' sockets: performs, on a tool's behalf, the connects and sends
its seccomp filter hands over (SECCOMP_RET_USER_NOTIF), after checking them.

For each call it takes the socket with `pidfd_getfd` (the same open file), copies the
address once with `process_vm_readv`, checks that the caller is still the one waiting
(so the pid named it throughout), decides on the copy and performs the call itself on
its own descriptor, with the copy: the address the kernel uses is the one checked,
whatever the tool's other threads write meanwhile. The tool gets the result, or EACCES.

One thread serves every listener of the process through epoll; calls that can block
(a connect, a send) run in a small thread pool, so one tool's slow connect holds up
neither Parley's event loop nor another tool's calls. Unix calls run as the tool's
user in a thread of their own, so the peer sees the tool's credentials, not Parley's,
and no long-lived thread of that user stays in Parley.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import socket
import stat
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field

from core.records import record
from core.sandbox import landlock, netsend, seccomp
from core.sandbox.netcall import (
    Call,
    Operation,
    Policy,
    Refused,
    ccall,
    check_inet,
    libc,
    read_sockaddr,
    sockopt,
)
from core.sandbox.netpolicy import unix_path

log = logging.getLogger(__name__)
TOOL_CAPS = (landlock.CAP_DAC_OVERRIDE, landlock.CAP_DAC_READ_SEARCH)  # as the tool has
_POOL_SIZE = 32  # IP calls in flight at once, across all tool calls
_libc = libc


@record(slots=True)
class Listener:
    """One spawn's seccomp listener, while the supervisor serves it."""

    fd: int
    policy: Policy
    refs: int = 1
    closing: bool = False
    inflight: set[int] = field(default_factory=set)  # our copies of sockets being used


class Supervisor:
    """Serves every seccomp listener of the process (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, Listener] = {}
        self._epoll: select.epoll | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Start the thread, once, from an unconfined thread: a thread inherits its
        creator's filter, Landlock domain and uid (the pool's workers are its own)."""
        with self._lock:
            if self._epoll is not None:
                return
            self._epoll = select.epoll()
            self._pool = ThreadPoolExecutor(_POOL_SIZE, thread_name_prefix="parley-net")
            threading.Thread(target=self._run, name="parley-net", daemon=True).start()

    def watch(self, fd: int, policy: Policy) -> Listener:
        with self._lock:
            assert self._epoll is not None, "start() first"
            entry = self._listeners[fd] = Listener(fd, policy)
            self._epoll.register(fd, select.EPOLLIN)
        return entry

    def release(self, entry: Listener) -> None:
        """Stop serving `entry`; calls still blocked in a connect or send are cut short."""
        with self._lock:
            if entry.closing:
                return
            entry.closing = True
            for sock in entry.inflight:
                _libc.shutdown(sock, socket.SHUT_RDWR)
        self._unref(entry)

    def _unref(self, entry: Listener) -> None:
        with self._lock:
            entry.refs -= 1
            if entry.refs or self._listeners.get(entry.fd) is not entry:
                return
            del self._listeners[entry.fd]
            assert self._epoll is not None
            with contextlib.suppress(OSError):
                self._epoll.unregister(entry.fd)
            os.close(entry.fd)

    def _take(self, fd: int) -> Listener | None:
        with self._lock:
            entry = self._listeners.get(fd)
            if entry is None or entry.closing:
                return None
            entry.refs += 1
            return entry

    def _run(self) -> None:
        assert self._epoll is not None
        while True:
            for fd, _events in self._epoll.poll():
                entry = self._take(fd)
                if entry is None:
                    continue
                try:
                    # Asked again, now: the event may be about a listener closed since,
                    # whose number a new one took (RECV would block; HUP would end it).
                    state = _now(fd)
                    if state & select.POLLIN:
                        self._serve(entry)
                    elif state & (select.POLLHUP | select.POLLERR):
                        self.release(entry)  # every process of the spawn has exited
                except Exception:  # the thread must live on: every supervised tool needs it
                    log.exception("socket supervisor: a call could not be served")
                finally:
                    self._unref(entry)

    def _serve(self, entry: Listener) -> None:
        try:
            notif = seccomp.receive(entry.fd)
        except OSError:
            return  # the caller died before we took it
        taken: list[int] = []
        try:
            operation, as_tool = self._decide(entry.policy, notif, taken)
            if not seccomp.still_waiting(entry.fd, notif.id):
                raise Refused(errno.EINTR)  # gone: the answer goes nowhere
        except Exception as exc:
            _close_all(taken)
            seccomp.reply(entry.fd, notif.id, error=_errno_of(exc))
            return
        with self._lock:
            entry.refs += 1
            entry.inflight.add(taken[0])
        job = _Job(self, entry, notif.id, operation, taken)
        user = entry.policy.user
        if as_tool and user is not None:
            threading.Thread(target=job.run_as, args=(user,), daemon=True).start()
        else:
            assert self._pool is not None
            self._pool.submit(job.run)

    def _decide(
        self, policy: Policy, notif: seccomp.Notif, taken: list[int]
    ) -> tuple[Operation, bool]:
        """What to do for one notification, from copies: the operation, and whether it
        must run as the tool's user. Raises Refused or OSError to answer at once."""
        args = tuple(notif.data.args)
        kind = policy.syscalls.get(notif.data.nr)
        pidfd = seccomp.pidfd_of(notif.pid)
        try:
            taken.append(seccomp.take_fd(pidfd, ctypes.c_int(args[0]).value))
            domain = sockopt(taken[0], socket.SO_DOMAIN)
            call = Call(notif.pid, pidfd, taken[0], domain, args, taken)
            if kind == "connect":
                return _connect(policy, call)
            if kind in ("sendto", "sendmsg", "sendmmsg"):
                return netsend.prepare(kind, policy, call), call.domain == socket.AF_UNIX
            raise Refused(errno.ENOSYS)
        finally:
            os.close(pidfd)

    def finished(self, entry: Listener, sock: int) -> None:
        with self._lock:
            entry.inflight.discard(sock)
        self._unref(entry)


@record(slots=True)
class _Job:
    supervisor: Supervisor
    entry: Listener
    notif_id: int
    operation: Operation
    taken: list[int]

    def run(self) -> None:
        try:
            seccomp.reply(self.entry.fd, self.notif_id, self.operation())
        except Exception as exc:
            seccomp.reply(self.entry.fd, self.notif_id, error=_errno_of(exc))
        finally:
            self.supervisor.finished(self.entry, self.taken[0])
            _close_all(self.taken)

    def run_as(self, user: tuple[int, int]) -> None:
        try:
            landlock.drop_thread_to_user(user[0], user[1], TOOL_CAPS)
        except OSError:
            self.operation = _refuse
        self.run()


def _refuse() -> int:
    raise Refused(errno.EACCES)


def _errno_of(exc: Exception) -> int:
    """The answer for a call that failed with `exc`: its errno; EACCES for anything we
    did not expect (logged: it is a bug here, and the call is refused, not let through)."""
    if isinstance(exc, Refused):
        return exc.code
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    log.error("socket supervisor: refused a call after %r", exc)
    return errno.EACCES


# --- connect ------------------------------------------------------------------------------


def _connect(policy: Policy, call: Call) -> tuple[Operation, bool]:
    raw = read_sockaddr(call.pid, call.args[1], call.args[2])
    sock = call.sock
    if call.domain == socket.AF_UNIX:
        path = unix_path(raw) if len(raw) > 2 else None
        target = policy.unix.target(path) if path else None
        if target is None:
            raise Refused(errno.EACCES)
        return (lambda: _connect_unix(sock, target)), True
    check_inet(policy, call.domain, raw, connect=True)
    return (lambda: ccall(_libc.connect, sock, raw, len(raw))), False


def _connect_unix(sock: int, target: str) -> int:
    """Connect to the listed socket itself: opened with no symlink on the way, then
    reached through our own descriptor, so nothing swapped in since can be reached."""
    try:
        held = seccomp.open_no_symlinks(target)
    except OSError as exc:
        code = errno.EACCES if exc.errno in (None, errno.ELOOP) else exc.errno
        raise Refused(code) from None
    try:
        if not stat.S_ISSOCK(os.fstat(held).st_mode):
            raise Refused(errno.ECONNREFUSED)
        path = f"/proc/thread-self/fd/{held}".encode()
        raw = struct.pack("=H", socket.AF_UNIX) + path + b"\0"
        return ccall(_libc.connect, sock, raw, len(raw))
    finally:
        os.close(held)


# --- small helpers --------------------------------------------------------------------------


def _now(fd: int) -> int:
    """The listener's poll events at this moment."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    ready = poller.poll(0)
    return ready[0][1] if ready else 0


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


SUPERVISOR = Supervisor()
