"""Seccomp-BPF socket rules for tool processes, built by hand with ctypes, and the few
syscalls a user-notification supervisor needs (`pidfd_getfd`, `process_vm_readv`, the
listener's ioctls).

Why our own: the rules are a few dozen BPF instructions, fixed per configuration, and
`libseccomp`'s Python binding is not on PyPI. The filter is installed by the spawn
thread on itself (no TSYNC) and inherited by the child, like Landlock.

What the program checks, in order:

1. the architecture: any other than the native one (the i386 `int 0x80` entry with its
   `socketcall`, arm32 on arm64) gets EACCES for every syscall, and on x86_64 so does an
   x32 syscall number (bit 30), the classic ways around a filter written for one table;
2. `socket` and `socketpair` against a per-mode table of families, types and protocols;
3. `io_uring_*` (it can create and connect sockets itself) answer ENOSYS, so programs
   fall back to plain syscalls; `pidfd_getfd` (taking another process's socket) EPERM;
4. in supervised modes `connect` (and, for "public", sends carrying an address) go to the
   supervisor through SECCOMP_RET_USER_NOTIF; options that route a packet through another
   hop first (IPv4 source routes, IPv6 routing headers) and TCP fast open are refused;
5. for "public", `bind` and `listen` (EACCES): outbound only, no server on any address.

The kernel surface outside the network (namespaces, keyrings, …) is a second filter,
core/sandbox/surface.py, stacked on this one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import socket
import threading
from collections.abc import Mapping, Sequence

from core.records import record
from core.sandbox.landlock import _libc, _syscall
from core.sandbox.landlock import set_no_new_privs as _prctl_no_new_privs

RET_ALLOW = 0x7FFF0000
RET_USER_NOTIF = 0x7FC00000
RET_ERRNO = 0x00050000

SET_MODE_FILTER = 1
GET_ACTION_AVAIL = 2
FILTER_FLAG_NEW_LISTENER = 1 << 3

# ioctls on the listener: _IOWR('!', 0, seccomp_notif), _IOWR('!', 1, seccomp_notif_resp),
# _IOW('!', 2, __u64)
IOCTL_NOTIF_RECV = 0xC0502100
IOCTL_NOTIF_SEND = 0xC0182101
IOCTL_NOTIF_ID_VALID = 0x40082102

MSG_FASTOPEN = 0x20000000
SOCK_TYPE_MASK = 0xF
PIDFD_THREAD = os.O_EXCL
SYS_PIDFD_GETFD = 438
SYS_OPENAT2 = 437
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_NO_MAGICLINKS = 0x02

# setsockopt options that send packets to another hop before their destination.
IP_OPTIONS = 4
IPV6_2292RTHDR = 5
IPV6_2292PKTOPTIONS = 6
IPV6_RTHDR = 57


@record(frozen=True, slots=True)
class _Arch:
    audit: int
    x32_bit: bool
    nr: Mapping[str, int]


_ARCHES = {
    "x86_64": _Arch(
        0xC000003E,
        True,
        {
            "socket": 41, "connect": 42, "sendto": 44, "sendmsg": 46, "bind": 49,
            "listen": 50, "socketpair": 53, "setsockopt": 54, "sendmmsg": 307, "seccomp": 317,
        },
    ),
    "aarch64": _Arch(
        0xC00000B7,
        False,
        {
            "socket": 198, "socketpair": 199, "bind": 200, "listen": 201, "connect": 203,
            "sendto": 206,
            "setsockopt": 208, "sendmsg": 211, "sendmmsg": 269, "seccomp": 277,
        },
    ),
}  # fmt: skip
_IO_URING = (425, 426, 427)  # setup, enter, register: the same on every architecture
ARCH = _ARCHES.get(platform.machine())

# --- the BPF program --------------------------------------------------------------------

_LD_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_AND = 0x54
_RET = 0x06


class _Insn(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    )


class _Fprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Insn)))


Label = str
Jump = Label | int  # a label, or 0: the next instruction


class _Asm:
    """A tiny assembler: forward jumps to labels, resolved once the program is done."""

    def __init__(self) -> None:
        self.code: list[tuple[int, Jump, Jump, int]] = []
        self.labels: dict[Label, int] = {}
        self._fresh = 0

    def label(self, name: Label) -> None:
        self.labels[name] = len(self.code)

    def new(self, hint: str) -> Label:
        self._fresh += 1
        return f"{hint}.{self._fresh}"

    def load(self, offset: int) -> None:
        self.code.append((_LD_ABS, 0, 0, offset))

    def arg(self, index: int, high: bool = False) -> None:
        # seccomp_data: nr (4), arch (4), instruction pointer (8), then six 64-bit args;
        # little-endian, so an int argument is the low word (the kernel ignores the rest).
        self.load(16 + 8 * index + (4 if high else 0))

    def jump(self, op: int, k: int, yes: Jump, no: Jump = 0) -> None:
        self.code.append((op, yes, no, k))

    def mask(self, k: int) -> None:
        self.code.append((_AND, 0, 0, k))

    def ret(self, value: int) -> None:
        self.code.append((_RET, 0, 0, value))

    def assemble(self) -> bytes:
        out = (_Insn * len(self.code))()
        for i, (code, yes, no, k) in enumerate(self.code):
            out[i] = _Insn(code, self._offset(i, yes), self._offset(i, no), k)
        return bytes(out)

    def _offset(self, at: int, target: Jump) -> int:
        if isinstance(target, int):
            return target
        distance = self.labels[target] - at - 1
        assert 0 <= distance < 256, f"jump to {target} out of range"
        return distance


def deny(code: int) -> int:
    return RET_ERRNO | code


TypeRule = frozenset[int] | None  # the protocols allowed for one type; None: any
FamilyRule = Mapping[int, TypeRule] | bool  # types allowed for one family; True/False: all/none


@record(frozen=True, slots=True)
class SocketRules:
    """Which sockets `socket()` may make: per family, the allowed types and protocols;
    families not listed get `other` (True: allowed)."""

    families: Mapping[int, FamilyRule]
    other: bool


STREAMS: dict[int, TypeRule] = {int(socket.SOCK_STREAM): None, int(socket.SOCK_SEQPACKET): None}
PAIRS = SocketRules({int(socket.AF_UNIX): STREAMS}, other=False)
"""`socketpair`, in every mode: a pair of connected unix streams. A datagram pair is
refused: `sendto` on one may name any pathname socket on the host (e.g. /dev/log)."""


def _socket_block(asm: _Asm, rules: SocketRules) -> None:
    allow, refuse = RET_ALLOW, deny(errno.EACCES)
    asm.arg(0)
    targets = {family: asm.new("family") for family in rules.families}
    for family, target in targets.items():
        asm.jump(_JEQ, family, target)
    asm.ret(allow if rules.other else refuse)
    for family, rule in rules.families.items():
        asm.label(targets[family])
        if isinstance(rule, bool):
            asm.ret(allow if rule else refuse)
            continue
        asm.arg(1)
        asm.mask(SOCK_TYPE_MASK)
        by_type = {kind: asm.new("type") for kind in rule}
        for kind, target in by_type.items():
            asm.jump(_JEQ, kind, target)
        asm.ret(refuse)
        for kind, protocols in rule.items():
            asm.label(by_type[kind])
            if protocols is None:
                asm.ret(allow)
                continue
            asm.arg(2)
            for protocol in sorted(protocols):
                asm.jump(_JEQ, protocol, "allow")
            asm.ret(refuse)


@record(frozen=True, slots=True)
class FilterSpec:
    """What one network mode's filter does (see the module docstring)."""

    sockets: SocketRules
    notify_connect: bool = False
    notify_sends: bool = False  # sendto with an address, every sendmsg and sendmmsg
    outbound_only: bool = False  # no `bind` or `listen`: nothing to be reached at


def build(spec: FilterSpec) -> bytes:
    """The BPF program for `spec` on this machine's architecture."""
    if ARCH is None:
        raise OSError(errno.ENOSYS, f"no seccomp rules for {platform.machine()}")
    nr, asm = ARCH.nr, _Asm()
    asm.load(4)
    asm.jump(_JEQ, ARCH.audit, 0, "foreign")
    asm.load(0)
    if ARCH.x32_bit:
        asm.jump(_JGE, 0x40000000, "foreign")
    asm.jump(_JEQ, nr["socket"], "socket")
    asm.jump(_JEQ, nr["socketpair"], "socketpair")
    for number in _IO_URING:
        asm.jump(_JEQ, number, "nosys")
    asm.jump(_JEQ, SYS_PIDFD_GETFD, "eperm")
    if spec.notify_connect:
        asm.jump(_JEQ, nr["connect"], "notify")
    if spec.outbound_only:
        asm.jump(_JEQ, nr["bind"], "eacces")
        asm.jump(_JEQ, nr["listen"], "eacces")
    if spec.notify_sends:
        asm.jump(_JEQ, nr["sendto"], "sendto")
        asm.jump(_JEQ, nr["sendmsg"], "sendmsg")
        asm.jump(_JEQ, nr["sendmmsg"], "sendmmsg")
        asm.jump(_JEQ, nr["setsockopt"], "setsockopt")
    asm.ret(RET_ALLOW)
    if spec.notify_sends:
        _sends(asm)
    asm.label("socket")
    _socket_block(asm, spec.sockets)
    asm.label("socketpair")
    _socket_block(asm, PAIRS)
    # BPF jumps only forward: the shared endings come last.
    for name, action in (
        ("allow", RET_ALLOW),
        ("notify", RET_USER_NOTIF),
        ("foreign", deny(errno.EACCES)),
        ("eacces", deny(errno.EACCES)),
        ("nosys", deny(errno.ENOSYS)),
        ("eperm", deny(errno.EPERM)),
        ("fastopen", deny(errno.EOPNOTSUPP)),
    ):
        asm.label(name)
        asm.ret(action)
    return asm.assemble()


def _sends(asm: _Asm) -> None:
    # sendto(fd, buf, len, flags, addr, addrlen): no address, no fast open: the kernel's.
    asm.label("sendto")
    asm.arg(3)
    asm.jump(_JSET, MSG_FASTOPEN, "fastopen")
    asm.arg(4)
    asm.jump(_JEQ, 0, 0, "notify")
    asm.arg(4, high=True)
    asm.jump(_JEQ, 0, "allow", "notify")
    # sendmsg(fd, msg, flags), sendmmsg(fd, msgs, n, flags): the addresses are in
    # memory, so the supervisor sends them (glibc's resolver needs sendmmsg: it does not
    # fall back when the call is missing).
    asm.label("sendmsg")
    asm.arg(2)
    asm.jump(_JSET, MSG_FASTOPEN, "fastopen", "notify")
    asm.label("sendmmsg")
    asm.arg(3)
    asm.jump(_JSET, MSG_FASTOPEN, "fastopen", "notify")
    # setsockopt(fd, level, name, ...): no source route, no routing header.
    asm.label("setsockopt")
    asm.arg(1)
    asm.jump(_JEQ, socket.IPPROTO_IP, 0, "ipv6opt")
    asm.arg(2)
    asm.jump(_JEQ, IP_OPTIONS, "eacces", "allow")
    asm.label("ipv6opt")
    asm.jump(_JEQ, socket.IPPROTO_IPV6, 0, "allow")
    asm.arg(2)
    for option in (IPV6_RTHDR, IPV6_2292RTHDR, IPV6_2292PKTOPTIONS):
        asm.jump(_JEQ, option, "eacces")
    asm.ret(RET_ALLOW)


# --- installing it ----------------------------------------------------------------------


def install(program: bytes, *, listener: bool) -> int:
    """Enforce `program` on the calling thread and its future children (needs
    `no_new_privs`). Returns the listener fd (close-on-exec) when `listener`, else -1."""
    assert ARCH is not None
    insns = (_Insn * (len(program) // ctypes.sizeof(_Insn))).from_buffer_copy(program)
    prog = _Fprog(len(insns), insns)
    flags = FILTER_FLAG_NEW_LISTENER if listener else 0
    result = _syscall(ARCH.nr["seccomp"], SET_MODE_FILTER, ctypes.c_uint(flags), ctypes.byref(prog))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")
    return int(result) if listener else -1


def filters_available() -> bool:
    """The kernel takes seccomp filters and we know this architecture's table."""
    if ARCH is None:
        return False
    action = ctypes.c_uint32(RET_ALLOW)
    return bool(_syscall(ARCH.nr["seccomp"], GET_ACTION_AVAIL, 0, ctypes.byref(action)) == 0)


@functools.cache
def supervision_available() -> bool:
    """User notification (Linux 5.0) and `pidfd_getfd` (5.6): what the supervisor of
    `connect` needs; and a listener can be made here (not when a filter Parley runs
    under already has one, as some container managers install)."""
    if not filters_available():
        return False
    assert ARCH is not None
    action = ctypes.c_uint32(RET_USER_NOTIF)
    if _syscall(ARCH.nr["seccomp"], GET_ACTION_AVAIL, 0, ctypes.byref(action)) != 0:
        return False
    _syscall(SYS_PIDFD_GETFD, -1, 0, 0)
    if ctypes.get_errno() != errno.EBADF:  # ENOSYS: no pidfd_getfd
        return False
    made: list[int] = []

    def probe() -> None:  # in a thread of its own, which the filter dies with
        with contextlib.suppress(OSError):
            _prctl_no_new_privs()
            made.append(install(build(FilterSpec(SocketRules({}, other=True))), listener=True))

    thread = threading.Thread(target=probe, name="parley-seccomp-probe")
    thread.start()
    thread.join()
    for fd in made:
        os.close(fd)
    return bool(made)


# --- what the supervisor calls ----------------------------------------------------------


class SeccompData(ctypes.Structure):
    _fields_ = (
        ("nr", ctypes.c_int),
        ("arch", ctypes.c_uint32),
        ("instruction_pointer", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * 6),
    )


class Notif(ctypes.Structure):
    _fields_ = (
        ("id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("data", SeccompData),
    )


class _Resp(ctypes.Structure):
    _fields_ = (
        ("id", ctypes.c_uint64),
        ("val", ctypes.c_int64),
        ("error", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    )


class _IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int
_process_vm_readv = _libc.process_vm_readv
_process_vm_readv.restype = ctypes.c_ssize_t
_process_vm_writev = _libc.process_vm_writev
_process_vm_writev.restype = ctypes.c_ssize_t


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def receive(listener: int) -> Notif:
    """The next notification (blocks when there is none: poll the listener first)."""
    notif = Notif()
    _check(_ioctl(listener, ctypes.c_ulong(IOCTL_NOTIF_RECV), ctypes.byref(notif)), "recv")
    return notif


def reply(listener: int, notif_id: int, value: int = 0, error: int = 0) -> bool:
    """Answer a notification: `value`, or -1 with errno `error`. False when the caller is
    gone (killed, or interrupted by a signal)."""
    resp = _Resp(notif_id, value, -error if error else 0, 0)
    return bool(_ioctl(listener, ctypes.c_ulong(IOCTL_NOTIF_SEND), ctypes.byref(resp)) == 0)


def still_waiting(listener: int, notif_id: int) -> bool:
    """The notification's caller is still blocked in the syscall, so its pid still
    names it: everything read from that pid before this check came from it."""
    ident = ctypes.c_uint64(notif_id)
    return bool(_ioctl(listener, ctypes.c_ulong(IOCTL_NOTIF_ID_VALID), ctypes.byref(ident)) == 0)


def pidfd_of(tid: int) -> int:
    """A pidfd for thread `tid` (its thread group's on kernels before 6.9)."""
    try:
        return os.pidfd_open(tid, PIDFD_THREAD)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    with open(f"/proc/{tid}/status", "rb") as f:
        tgid = next(int(line.split()[1]) for line in f if line.startswith(b"Tgid:"))
    return os.pidfd_open(tgid)


def take_fd(pidfd: int, fd: int) -> int:
    """The target's `fd` as a new fd of ours (close-on-exec): the same open file."""
    return _check(int(_syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)), "pidfd_getfd")


def read_memory(tid: int, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """Copies of `ranges` (address, length) of `tid`'s memory, read once.

    Raises:
        OSError: EFAULT when any range is not wholly readable.
    """
    total = sum(length for _, length in ranges)
    if total == 0:
        return [b"" for _ in ranges]
    buf = ctypes.create_string_buffer(total)
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), total)
    remote = (_IoVec * len(ranges))(*(_IoVec(addr, length) for addr, length in ranges))
    got = _process_vm_readv(
        tid, ctypes.byref(local), ctypes.c_ulong(1), remote, ctypes.c_ulong(len(ranges)), 0
    )
    if _check(got, "process_vm_readv") != total:
        raise OSError(errno.EFAULT, "process_vm_readv: short read")
    out, at = [], 0
    for _, length in ranges:
        out.append(buf.raw[at : at + length])
        at += length
    return out


def write_memory(tid: int, addr: int, data: bytes) -> bool:
    """Write `data` at `addr` in `tid`'s memory (a result the syscall hands back)."""
    buf = ctypes.create_string_buffer(data, len(data))
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), len(data))
    remote = _IoVec(addr, len(data))
    one = ctypes.c_ulong(1)
    written = _process_vm_writev(tid, ctypes.byref(local), one, ctypes.byref(remote), one, 0)
    return bool(written == len(data))


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def open_no_symlinks(path: str, flags: int = os.O_PATH | os.O_CLOEXEC) -> int:
    """An fd for `path` opened with `flags` if no component of it is a symlink or a
    /proc magic link (openat2): the kernel opens exactly the path as written."""
    how = _OpenHow(flags, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    return _check(
        int(_syscall(SYS_OPENAT2, -100, raw, ctypes.byref(how), ctypes.c_size_t(24))), "openat2"
    )
