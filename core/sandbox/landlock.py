"""A small ctypes layer over the Linux Landlock syscalls and the few process controls the
tool sandbox needs (`prctl`, capabilities).

Why our own layer and not the `landlock` package: that package is a pre-release
(1.0.0.dev5) that covers filesystem rules only, and it opens paths and builds the
ruleset in the process it restricts. We need network rules (ABI 4) and scopes (ABI 6),
and we build every ruleset in Parley's process so that the forked child, between fork
and exec, only makes a handful of syscalls (`landlock_restrict_self` and friends).

Constants follow `include/uapi/linux/landlock.h`; the three syscall numbers are the
same on every architecture (they were allocated after the syscall tables were unified).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Iterable
from pathlib import Path

from core.records import record

SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1

# Filesystem access rights, and the ABI version that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

_FS_V1 = (1 << 13) - 1
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The only rights a rule on a non-directory may carry."""

READ_ONLY = EXECUTE | READ_FILE | READ_DIR
READ_WRITE = (
    READ_ONLY
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
    | IOCTL_DEV
)

PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
_CAPABILITY_VERSION_3 = 0x20080522

# The C library this interpreter already runs on (dlopen(NULL)): `ctypes.util.find_library`
# would run `ldconfig -p` in a subprocess, a subprocess per start-up (docs/benchmarks.md).
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The Landlock ABI the kernel offers; 0 when Landlock is missing or disabled."""
    result = _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    return max(int(result), 0)


def fs_rights(abi: int) -> int:
    """Every filesystem right this ABI handles."""
    rights = _FS_V1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


@record(frozen=True, slots=True)
class Rule:
    """Grant `rights` beneath `path` (a directory), or on it (a file)."""

    path: Path
    rights: int


def create_ruleset(abi: int, rules: Iterable[tuple[int, int]], *, handled_net: int = 0) -> int:
    """A ruleset fd (close-on-exec) handling every right this ABI knows.

    Args:
        abi: the kernel's ABI version (>= 1).
        rules: (O_PATH fd, rights) pairs; rights outside the ABI are dropped.
        handled_net: network rights (NET_BIND_TCP, NET_CONNECT_TCP) to handle with no
            rule, so denied (ABI 4+).
    """
    handled = fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        attr.handled_access_net = handled_net
    if abi >= 6:
        size = 24
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    ruleset = _check(
        _syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0),
        "landlock_create_ruleset",
    )
    try:
        for fd, rights in rules:
            beneath = _PathBeneathAttr(rights & handled, fd)
            _check(
                _syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(beneath), 0),
                "landlock_add_rule",
            )
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def restrict_self(ruleset: int) -> None:
    """Enforce `ruleset` on the calling thread and its future children (needs
    `no_new_privs` or CAP_SYS_ADMIN)."""
    _check(_syscall(SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")


def prctl(option: int, arg: int = 0) -> None:
    _check(_prctl(option, arg, 0, 0, 0), f"prctl({option})")


def unshare_call_namespaces() -> None:
    """Make the calling thread's next child the first process (PID 1) of a new PID
    namespace, and move the thread into a new IPC namespace its child inherits (System V
    IPC and POSIX message queues of its own, gone with its last process). Per-thread, so
    allowed in a multithreaded process (unlike a new user namespace); needs
    CAP_SYS_ADMIN."""
    _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWIPC), "unshare(CLONE_NEWPID|CLONE_NEWIPC)")


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def make_undumpable() -> None:
    """No same-user process may read our memory or `/proc/<pid>/environ`, and no core
    file is written."""
    prctl(PR_SET_DUMPABLE, 0)


def _capset(mask: int) -> None:
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)(_CapData(mask, mask, mask), _CapData(0, 0, 0))
    _check(_libc.capset(ctypes.byref(header), data), "capset")


# Raw credential syscalls: glibc's setresuid() & co. change every thread of the process
# (they broadcast), but the spawner must change only its own, throwaway thread.
_CRED_SYSCALLS = {
    "x86_64": {"setgroups": 116, "setresuid": 117, "setresgid": 119},
    "aarch64": {"setgroups": 159, "setresuid": 147, "setresgid": 149},
}


def can_change_thread_user() -> bool:
    return platform.machine() in _CRED_SYSCALLS


def drop_thread_to_user(uid: int, gid: int, keep_caps: tuple[int, ...]) -> None:
    """Make the calling thread `uid`/`gid` (no supplementary groups), keeping only
    `keep_caps`, as ambient capabilities so they survive exec; every other capability
    leaves the thread's bounding set. Other threads keep their credentials.

    Only for a root parent: it needs CAP_SETUID, CAP_SETGID and CAP_SETPCAP.
    """
    numbers = _CRED_SYSCALLS[platform.machine()]
    for cap in range(64):
        if cap not in keep_caps and _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the kernel's last capability
                break
            _check(-1, "PR_CAPBSET_DROP")
    prctl(PR_SET_KEEPCAPS, 1)
    _check(_syscall(numbers["setgroups"], 0, None), "setgroups")
    _check(_syscall(numbers["setresgid"], gid, gid, gid), "setresgid")
    _check(_syscall(numbers["setresuid"], uid, uid, uid), "setresuid")
    mask = 0
    for cap in keep_caps:
        mask |= 1 << cap
    _capset(mask)
    for cap in keep_caps:
        _check(_prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0), "PR_CAP_AMBIENT")
