"""One socket call a tool's filter handed to the supervisor: what was copied from the
tool, the answers it can get, and the checks shared by connects and sends."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
from collections.abc import Callable

from core.records import record
from core.sandbox import landlock, seccomp
from core.sandbox.netpolicy import PublicOnly, UnixList, parse_inet

INET = (socket.AF_INET, socket.AF_INET6)
_MAX_ADDR = 128  # sizeof(struct sockaddr_storage): the kernel refuses longer

libc = landlock._libc
for _name in ("sendto", "sendmsg"):
    getattr(libc, _name).restype = ctypes.c_ssize_t


@record(frozen=True, slots=True)
class Policy:
    """What one configuration's supervisor allows."""

    unix: UnixList
    public: PublicOnly | None  # None: any IP destination
    user: tuple[int, int] | None  # the tools' uid and gid when Parley drops to them
    syscalls: dict[int, str]  # syscall number -> "connect", "sendto", "sendmsg", "sendmmsg"


class Refused(Exception):
    """The answer is this errno, and nothing is done."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code


Operation = Callable[[], int]


@record(frozen=True, slots=True)
class Call:
    """One notified call, with the socket already taken from the tool."""

    pid: int  # the caller's thread id, valid while it waits
    pidfd: int
    sock: int
    domain: int
    args: tuple[int, ...]
    taken: list[int]  # every fd we took for it (the socket first): closed after


def read_sockaddr(pid: int, addr: int, length: int) -> bytes:
    """A copy of the tool's address argument (b"" for none)."""
    size = ctypes.c_int(length).value
    if size < 0 or size > _MAX_ADDR:
        raise Refused(errno.EINVAL)
    if addr == 0 or size == 0:
        return b""
    return seccomp.read_memory(pid, [(addr, size)])[0]


def check_inet(policy: Policy, domain: int, raw: bytes, *, connect: bool) -> None:
    """Raise Refused unless `raw` on a socket of `domain` is a destination the policy
    allows."""
    if policy.public is None:
        return
    if domain not in INET:
        raise Refused(errno.EACCES)
    try:
        dest = parse_inet(domain, raw, connect=connect)
    except ValueError:
        raise Refused(errno.EINVAL) from None
    if not policy.public.allows(dest):
        raise Refused(errno.EACCES)


def ccall(function: Callable[..., int], *args: object) -> int:
    """A libc call; OSError with its errno when it fails."""
    result = function(*args)
    if result < 0:
        raise OSError(ctypes.get_errno(), "")
    return int(result)


def sockopt(sock: int, option: int) -> int:
    value, size = ctypes.c_int(), ctypes.c_uint32(4)
    level = socket.SOL_SOCKET
    ccall(libc.getsockopt, sock, level, option, ctypes.byref(value), ctypes.byref(size))
    return value.value
