"""The kernel surface and IPC between calls, tried from inside a tool call as an attacker
would: a script the model wrote, run by the real bash tool (past every text check), that
makes raw syscalls with ctypes.

- Every call has an IPC namespace of its own: a System V shared memory segment, message
  queue or POSIX message queue that one call makes is gone when it ends, and no other
  call (nor Parley) finds it; a root Parley caps a call's shared memory at its memory
  limit.
- The kernel-surface filter (core/sandbox/surface.py) denies namespaces, keyrings,
  `userfaultfd`, `perf_event_open`, `bpf`, mounts and the rest: each is tried once under
  the filter as real root, where the kernel itself would have let it through.
- `network = "public"` is outbound only: no `bind`, no `listen`.
- An ordinary user's Parley (util-linux `unshare` makes the namespaces after the filter
  is in force) holds the same.
"""

from __future__ import annotations

import asyncio
import errno
import os
import pwd
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from core.sandbox import landlock, seccomp, surface
from core.sandbox.jail import Jail
from tests.process import REPO
from tests.tools.test_wall_network import attack, refused, settings_for

MiB = 1 << 20


def _require(reason: str) -> None:
    if os.environ.get("PARLEY_REQUIRE_SANDBOX") == "1":
        pytest.fail(f"{reason}, and PARLEY_REQUIRE_SANDBOX=1")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _sandbox() -> None:
    if landlock.abi_version() == 0:
        _require("this kernel has no Landlock")
    if not seccomp.filters_available() or not surface.TABLE:
        _require("no seccomp filters here")


SYSV = r"""
import os
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
KEY = int(sys.argv[2])
IPC_CREAT = 0o1000

def check(result):
    if result == -1 or result is None:
        raise OSError(ctypes.get_errno(), "")
    return result

def put_shm():
    seg = check(libc.shmget(KEY, 4096, IPC_CREAT | 0o666))
    addr = libc.shmat(seg, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "shmat")
    ctypes.memmove(addr, b"secret of call A", 16)
    libc.shmdt(ctypes.c_void_p(addr))

def get_shm():
    seg = check(libc.shmget(KEY, 0, 0))
    addr = libc.shmat(seg, None, 0)
    print("LEAK", ctypes.string_at(addr, 16), flush=True)

class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 32)]

def put_msg():
    queue = check(libc.msgget(KEY + 1, IPC_CREAT | 0o666))
    check(libc.msgsnd(queue, ctypes.byref(Msg(1, b"secret of call A")), 32, 0))

def get_msg():
    check(libc.msgget(KEY + 1, 0))

NAME = b"/parley-%d" % KEY
def put_mq():
    check(libc.mq_open(NAME, os.O_CREAT | os.O_RDWR, 0o666, None))

def get_mq():
    check(libc.mq_open(NAME, os.O_RDONLY))

PUT = (("shm", put_shm), ("msg", put_msg), ("mq", put_mq))
GET = (("shm", get_shm), ("msg", get_msg), ("mq", get_mq))
for name, attempt in PUT if sys.argv[1] == "put" else GET:
    report(name, attempt)
"""


def _host_has(key: int) -> list[str]:
    """What of `key`'s objects Parley's own IPC namespace holds."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    found = []
    if libc.shmget(key, 0, 0) != -1:
        found.append("shm")
    if libc.msgget(key + 1, 0) != -1:
        found.append("msg")
    if libc.mq_open(b"/parley-%d" % key, os.O_RDONLY) != -1:
        found.append("mq")
    return found


async def test_what_one_call_leaves_in_ipc_no_other_call_finds(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    key = random.randrange(0x10000, 0x7FFF0000)
    made = await attack(settings, SYSV, "put", key)
    assert made["shm"] == made["msg"] == "ok", made  # each call may use System V IPC
    # POSIX queues live in the mqueue filesystem, which Landlock grants no tool.
    assert refused(made["mq"], errno.EACCES), made
    found = await attack(settings, SYSV, "get", key)
    assert all(refused(found[name], errno.ENOENT) for name in ("shm", "msg", "mq")), found
    assert _host_has(key) == []  # nor did it outlive the call in Parley's namespace


SHM_FLOOD = r"""
def segment(i):
    size = 48 << 20
    if libc.shmget(0, size, 0o1000 | 0o600) == -1:  # IPC_PRIVATE, IPC_CREAT
        raise OSError(ctypes.get_errno(), "shmget")
for i in range(4):
    report(f"seg{i}", lambda: segment(i))
"""


async def test_a_calls_shared_memory_is_capped_at_its_memory_limit(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, max_memory_bytes=64 * MiB)
    jail = Jail(settings)
    try:
        if jail.pid_namespaces is None or not jail.pid_namespaces.in_thread:
            pytest.skip("the cap is set by a root Parley's spawn thread")
    finally:
        jail.close()
    made = await attack(settings, SHM_FLOOD)
    # 4 x 48 MiB asked, 64 MiB allowed: the first fits, the rest do not.
    assert made["seg0"] == "ok", made
    assert all(refused(made[f"seg{i}"], errno.ENOSPC) for i in (1, 2, 3)), made


SURFACE = r"""
def call(nr, *args):
    def attempt():
        if libc.syscall(nr, *args) == -1:
            raise OSError(ctypes.get_errno(), "")
    return attempt

class PerfAttr(ctypes.Structure):  # user-space-only self-measurement: paranoid 2 allows it
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("rest", ctypes.c_uint64 * 14)]
perf = PerfAttr(1, 128, 0)  # PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK
perf.rest[1] = (1 << 5) | (1 << 6)  # exclude_kernel, exclude_hv

NR = {"x86_64": dict(unshare=272, clone=56, clone3=435, setns=308, add_key=248,
                     request_key=249, keyctl=250, userfaultfd=323, perf_event_open=298,
                     mount=165, bpf=321),
      "aarch64": dict(unshare=97, clone=220, clone3=435, setns=268, add_key=217,
                      request_key=218, keyctl=219, userfaultfd=282, perf_event_open=241,
                      mount=40, bpf=280)}[__import__("platform").machine()]
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x20000, 0x40000000
SIGCHLD = 17

def clone_user():
    pid = libc.syscall(NR["clone"], CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        __import__("os")._exit(0)
    if pid == -1:
        raise OSError(ctypes.get_errno(), "")

for name, attempt in {
    "unshare-user": call(NR["unshare"], CLONE_NEWUSER),
    "unshare-net": call(NR["unshare"], CLONE_NEWNET),
    "unshare-mount": call(NR["unshare"], CLONE_NEWNS),
    "clone-user": clone_user,
    "clone3": call(NR["clone3"], ctypes.create_string_buffer(88), 88),
    "setns": call(NR["setns"], 0, 0),
    "add_key": call(NR["add_key"], b"user", b"parley", b"secret", 6, -4),
    "request_key": call(NR["request_key"], b"user", b"parley", None, -4),
    "keyctl": call(NR["keyctl"], 0, -4, 0),  # KEYCTL_GET_KEYRING_ID of the user keyring
    "userfaultfd": call(NR["userfaultfd"], 1),  # UFFD_USER_MODE_ONLY: allowed to anyone
    "perf_event_open": call(NR["perf_event_open"], ctypes.byref(perf), 0, -1, -1, 0),
    "mount": call(NR["mount"], b"none", b"/tmp", b"tmpfs", 0, None),
    "bpf": call(NR["bpf"], 0, None, 0),
}.items():
    report(name, attempt)
"""


async def test_a_tool_cannot_reach_namespaces_keyrings_or_kernel_objects(tmp_path: Path) -> None:
    outcome = await attack(settings_for(tmp_path), SURFACE)
    expected = dict.fromkeys(outcome, errno.EPERM) | {"clone3": errno.ENOSYS}
    assert set(outcome) >= {"unshare-user", "add_key", "userfaultfd", "perf_event_open"}
    wrong = {name: got for name, got in outcome.items() if not refused(got, expected[name])}
    assert wrong == {}, outcome


async def test_util_linux_unshare_cannot_make_a_user_namespace_in_a_tool(tmp_path: Path) -> None:
    from tests.tools.test_wall_network import bash_tool

    settings = settings_for(tmp_path)
    ws = settings.resolved_workspace()
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "escape.sh").write_text("unshare -r id; echo status=$?\n")  # no text check reads it
    output = await bash_tool(settings, "bash escape.sh")
    assert "status=0" not in output, output
    assert "uid=0(root)" not in output, output


# --- every denied call, under the filter, as real root --------------------------------------

_AS_ROOT = r"""
import ctypes, errno, os, sys
from core.sandbox import landlock, seccomp, surface
libc = ctypes.CDLL(None, use_errno=True)
# Whatever slipped through would land in throwaway UTS and IPC namespaces.
if libc.unshare(surface.CLONE_NEWUTS | surface.CLONE_NEWIPC) != 0:
    sys.exit("unshare: %s" % os.strerror(ctypes.get_errno()))
landlock.set_no_new_privs()
seccomp.install(surface.program(unshare_flags=int(sys.argv[1]), private_ipc=sys.argv[2] == "1"),
                listener=False)
if libc.prctl(21, 0, 0, 0, 0) != 2:  # PR_GET_SECCOMP: filter mode, or nothing runs
    sys.exit("no filter")
def answer(nr, *args):
    result = libc.syscall(nr, *args)
    if result == 0 and nr == surface.TABLE["clone"]:
        os._exit(0)
    return "ok" if result != -1 else errno.errorcode[ctypes.get_errno()]
names = sys.argv[3].split(",")
for name in names:
    print(name, answer(surface.TABLE[name], *[ctypes.c_long(0)] * 6))
print("fork", "ok" if os.fork() or os._exit(0) else "")
print("unshare-set-up", answer(surface.TABLE["unshare"], ctypes.c_long(int(sys.argv[1]))))
print("unshare-files", answer(surface.TABLE["unshare"], ctypes.c_long(0x400)))  # CLONE_FILES
for flag in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000, 0x80):
    print("unshare-%x" % flag, answer(surface.TABLE["unshare"], ctypes.c_long(flag)))
    print("clone-%x" % flag, answer(surface.TABLE["clone"], ctypes.c_long(flag | 17), *[0] * 4))
print("clone3", answer(surface.TABLE["clone3"], ctypes.c_long(0), ctypes.c_long(0)))
"""


def _as_root(unshare_flags: int, private_ipc: bool, names: list[str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _AS_ROOT, str(unshare_flags), "1" if private_ipc else "0",
         ",".join(names)],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        start_new_session=True,  # no controlling terminal for vhangup to hang up
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def test_every_denied_call_is_refused_where_root_would_have_made_it() -> None:
    if os.geteuid() != 0:
        pytest.skip("the calls must be tried where only the filter stands in their way")
    names = [name for name in (*surface.DENIED, *surface.IPC) if name in surface.TABLE]
    got = _as_root(0, private_ipc=False, names=names)
    assert {name: got[name] for name in names} == dict.fromkeys(names, "EPERM")
    namespaced = [key for key in got if key.startswith(("unshare-", "clone-"))]
    allowed = ("unshare-files", "unshare-set-up")  # no namespace flag: 0 and CLONE_FILES
    refused_all = {key: got[key] for key in namespaced if key not in allowed}
    assert set(refused_all.values()) == {"EPERM"}, got  # the set-up's flags too: none here
    assert got["unshare-files"] == "ok"  # ordinary calls still work
    assert got["fork"] == "ok"
    assert got["clone3"] == "ENOSYS"  # so the C library falls back to clone


def test_an_ordinary_users_filter_lets_through_only_its_own_set_up() -> None:
    if os.geteuid() != 0:
        pytest.skip("the calls must be tried where only the filter stands in their way")
    from core.sandbox.pidns import UNSHARE_FLAGS

    got = _as_root(UNSHARE_FLAGS, private_ipc=True, names=["shmget", "msgget", "mq_open"])
    assert got["unshare-set-up"] == "ok", got
    assert got["unshare-10000000"] == "EPERM"  # a user namespace alone: no
    assert got["clone-10000000"] == "EPERM"
    assert [got[n] for n in ("shmget", "msgget", "mq_open")] != ["EPERM"] * 3  # IPC of its own


# --- network = "public": outbound only ------------------------------------------------------

SERVE = r"""
def serve(kind, family, host):
    s = socket.socket(family, kind)
    s.bind((host, 0))
    if kind == socket.SOCK_STREAM:
        s.listen()
report("tcp4", lambda: serve(socket.SOCK_STREAM, socket.AF_INET, "127.0.0.1"))
report("tcp6", lambda: serve(socket.SOCK_STREAM, socket.AF_INET6, "::1"))
report("udp4", lambda: serve(socket.SOCK_DGRAM, socket.AF_INET, "127.0.0.1"))
report("any4", lambda: serve(socket.SOCK_STREAM, socket.AF_INET, "0.0.0.0"))
def listen_unbound():
    s = socket.socket()
    s.listen()  # the kernel picks a port: a server without a bind
report("listen", listen_unbound)
"""


async def test_public_network_is_outbound_only(tmp_path: Path) -> None:
    outcome = await attack(settings_for(tmp_path, network="public"), SERVE)
    assert set(outcome) == {"tcp4", "tcp6", "udp4", "any4", "listen"}
    assert all(refused(got, errno.EACCES) for got in outcome.values()), outcome


async def test_an_open_network_may_still_serve_on_loopback(tmp_path: Path) -> None:
    outcome = await attack(settings_for(tmp_path), SERVE)
    assert outcome["tcp4"] == "ok", outcome
    assert outcome["listen"] == "ok", outcome


# --- an ordinary user's Parley -------------------------------------------------------------

_ORDINARY = r"""
import asyncio, concurrent.futures.thread, os, sys  # all imported before the drop: this
# interpreter may live where the user cannot read (a 0700 /root)
from core.sandbox.settings import SandboxSettings
from tests.tools.test_wall_network import attack
from tests.tools.test_wall_kernel import SURFACE, SYSV
from core.sandbox.jail import Jail

base, uid, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
settings = SandboxSettings(workspace=base + "/ws", artifacts_dir=base + "/art", default_timeout=30)
print(Jail(settings).describe())
async def main():
    print("PUT", await attack(settings, SYSV, "put", key))
    print("GET", await attack(settings, SYSV, "get", key))
    print("SURFACE", await attack(settings, SURFACE))
asyncio.run(main())
"""


async def test_an_ordinary_users_tools_get_the_same_walls(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("becoming an ordinary user needs root")
    try:
        user = pwd.getpwnam("parleytest")
    except KeyError:
        user = pwd.getpwnam("nobody")
    holder = tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-kernel-")
    base = Path(holder.name)
    os.chmod(base, 0o777)
    key = random.randrange(0x10000, 0x7FFF0000)
    # The system's python3 for the tool's script: the user may not reach this interpreter's.
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(base), "PYTHONPATH": str(REPO),
           "HOME": str(base)}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ORDINARY, str(base), str(user.pw_uid), str(key),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    holder.cleanup()
    if "user+PID+IPC namespace per call" not in text:
        _require(f"no user namespaces for an ordinary user here: {text[:300]}")
    assert "kernel surface" in text, text
    lines = {line.split(" ", 1)[0]: line for line in text.splitlines()}
    assert {"PUT", "GET", "SURFACE"} <= set(lines), text
    assert "'shm': 'ok'" in lines["PUT"], text
    assert "'ok'" not in lines["GET"], text  # the second call found nothing
    assert "'ok'" not in lines["SURFACE"], text
    assert _host_has(key) == []
