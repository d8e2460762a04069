"""The kernel surface a tool process may not reach: a second seccomp filter, stacked on the
network one (core/sandbox/seccomp.py), that every spawn installs.

It denies, with EPERM, what Docker's default seccomp profile denies to an unprivileged
container, and a little more:

- namespaces: `setns`, `unshare` and `clone` with any `CLONE_NEW*` flag (a new user
  namespace hands a process every capability inside it, and with them new mount and
  network namespaces); `clone3`, whose flags sit in memory a filter cannot read, answers
  ENOSYS so the C library falls back to `clone`;
- the kernel keyrings: `add_key`, `keyctl`, `request_key` (one per uid, shared by every
  call of the tools' user);
- `userfaultfd`, `bpf`, `perf_event_open`, `fanotify_init`, `kcmp`, `syslog`;
- the mount family: `mount`, `umount2`, `pivot_root`, `chroot`, `open_tree`,
  `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`;
- file handles (`name_to_handle_at`, `open_by_handle_at`: a way around paths), quotas;
- the machine's state: modules (`init_module`, `finit_module`, `delete_module`),
  `kexec_load`, `kexec_file_load`, `reboot`, `swapon`, `swapoff`, `acct`, the clock
  (`settimeofday`, `clock_settime`, `clock_adjtime`), `sethostname`, `setdomainname`,
  `vhangup`, `iopl`, `ioperm`, `modify_ldt`, NUMA memory policy, and obsolete calls
  (`uselib`, `ustat`, `sysfs`, `_sysctl`, `nfsservctl`, `lookup_dcookie`, …).

Parley's own per-call set-up needs none of them once the filter is in force, with one
exception: an ordinary user's Parley has util-linux `unshare` make the call's user, PID
and IPC namespaces after the filter is installed (core/sandbox/pidns.py), so that exact
set of flags stays allowed there — a process that repeats it gets only another empty
namespace, in which everything above is still denied.

Where a call cannot have an IPC namespace of its own (no PID namespace either), System V
IPC and POSIX message queues are denied too: they would be shared with every other call.

Both filters refuse a foreign syscall entry (i386 `int 0x80`, x32), each on its own.
"""

from __future__ import annotations

import errno
import platform
from collections.abc import Mapping

from core.sandbox.seccomp import _JEQ, _JGE, _JSET, RET_ALLOW, _Asm, deny

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080  # unshare and clone3 only
NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
    | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWTIME
)  # fmt: skip

DENIED = (
    # namespaces (clone and unshare are checked by their flags)
    "setns",
    # keyrings
    "add_key", "keyctl", "request_key",
    # kernel objects that outlive or reach past a call
    "userfaultfd", "bpf", "perf_event_open", "fanotify_init", "kcmp", "syslog",
    # mounts
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # file handles, quotas
    "name_to_handle_at", "open_by_handle_at", "quotactl", "quotactl_fd",
    # the machine's state
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "sethostname", "setdomainname", "vhangup", "iopl", "ioperm",
    "modify_ldt", "mbind", "set_mempolicy", "get_mempolicy", "move_pages",
    "set_mempolicy_home_node",
    # obsolete
    "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "lookup_dcookie",
    "create_module", "get_kernel_syms", "query_module",
)  # fmt: skip
"""Denied with EPERM in every mode (see the module docstring)."""

IPC = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
)  # fmt: skip
"""Denied where a call has no IPC namespace of its own."""

_GENERIC = {  # asm-generic numbers, shared by the newer calls of every architecture
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443,
    "set_mempolicy_home_node": 450,
}  # fmt: skip
_TABLES: dict[str, Mapping[str, int]] = {
    "x86_64": {
        **_GENERIC,
        "shmget": 29, "shmat": 30, "shmctl": 31, "clone": 56, "semget": 64, "semop": 65,
        "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "syslog": 103, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153,
        "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156, "chroot": 161, "acct": 163,
        "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
        "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
        "create_module": 174, "init_module": 175, "delete_module": 176,
        "get_kernel_syms": 177, "query_module": 178, "quotactl": 179, "nfsservctl": 180,
        "lookup_dcookie": 212, "semtimedop": 220, "clock_settime": 227, "mbind": 237,
        "set_mempolicy": 238, "get_mempolicy": 239, "mq_open": 240, "mq_unlink": 241,
        "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "unshare": 272, "move_pages": 279, "perf_event_open": 298, "fanotify_init": 300,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305,
        "setns": 308, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
        "bpf": 321, "userfaultfd": 323,
    },
    "aarch64": {
        **_GENERIC,
        "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60, "acct": 89,
        "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "clock_settime": 112, "syslog": 116, "reboot": 142,
        "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "mq_open": 180,
        "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184,
        "mq_getsetattr": 185, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189,
        "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194,
        "shmctl": 195, "shmat": 196, "shmdt": 197, "add_key": 217, "request_key": 218,
        "keyctl": 219, "clone": 220, "swapon": 224, "swapoff": 225, "mbind": 235,
        "get_mempolicy": 236, "set_mempolicy": 237, "move_pages": 239,
        "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268, "kcmp": 272,
        "finit_module": 273, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
    },
}  # fmt: skip
TABLE = _TABLES.get(platform.machine(), {})
"""This machine's numbers; a name missing from it is a call the architecture lacks."""

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def program(*, unshare_flags: int = 0, private_ipc: bool = True) -> bytes:
    """The filter for this machine: `unshare_flags`, the exact namespace flags `unshare`
    may still be given (0: none); `private_ipc`, whether each call has an IPC namespace
    of its own (if not, System V IPC and message queues are denied)."""
    arch = _AUDIT_ARCH.get(platform.machine())
    if arch is None or not TABLE:
        raise OSError(errno.ENOSYS, f"no syscall table for {platform.machine()}")
    asm = _Asm()
    asm.load(4)
    asm.jump(_JEQ, arch, 0, "foreign")
    asm.load(0)
    if platform.machine() == "x86_64":
        asm.jump(_JGE, 0x40000000, "foreign")  # the x32 numbers
    asm.jump(_JEQ, TABLE["clone"], "clone")
    asm.jump(_JEQ, TABLE["unshare"], "unshare")
    asm.jump(_JEQ, TABLE["clone3"], "nosys")
    for name in DENIED + (() if private_ipc else IPC):
        if name in TABLE:
            asm.jump(_JEQ, TABLE[name], "deny")
    asm.ret(RET_ALLOW)
    asm.label("clone")  # clone(flags, …) on every architecture
    asm.arg(0)
    asm.jump(_JSET, NAMESPACE_FLAGS, "deny", "allow")
    asm.label("unshare")
    asm.arg(0)
    if unshare_flags:
        asm.jump(_JEQ, unshare_flags, "allow")
    asm.jump(_JSET, NAMESPACE_FLAGS, "deny", "allow")
    for name, action in (
        ("allow", RET_ALLOW),
        ("deny", deny(errno.EPERM)),
        ("nosys", deny(errno.ENOSYS)),
        ("foreign", deny(errno.EACCES)),  # as the network filter answers
    ):
        asm.label(name)
        asm.ret(action)
    return asm.assemble()
