"""The network wall of the tool sandbox: which sockets tools may make and where they may
connect, per `tools.network`, enforced by a seccomp filter each spawn installs and, where
addresses must be checked, the supervisor (core/sandbox/netsupervisor.py).

- `false` ("closed"): `socket()` is refused for every family; only `socketpair` of unix
  streams remains. Landlock also denies TCP bind and connect.
- `true` ("open"): every socket but unix ones, which only `tools.unix_sockets` opens, and
  then only to the listed paths (each connect checked and made by the supervisor).
- `"public"`: IPv4/IPv6 TCP, UDP and ping sockets, to public addresses only (plus the
  resolv.conf nameservers on port 53); connects and sends with an address are checked
  and made by the supervisor; outbound only: `bind` and `listen` are refused (and TCP
  bind by Landlock too).
"""

from __future__ import annotations

import os
import socket
from dataclasses import field
from typing import TYPE_CHECKING, Literal

from core.errors import ConfigError
from core.records import record
from core.sandbox import landlock, seccomp
from core.sandbox.netpolicy import PublicOnly, UnixList, nameservers
from core.sandbox.settings import SandboxSettings

if TYPE_CHECKING:
    # The supervisor (its thread, and the code that reads a tool's socket calls) is loaded
    # by a configuration that supervises, not by every start (docs/benchmarks.md).
    from core.sandbox.netcall import Policy
    from core.sandbox.netsupervisor import Listener

__all__ = ["Listener", "NetGuard", "describe", "filter_spec", "guard_for", "handled_net"]

Mode = Literal["closed", "open", "public"]
_IP_TYPES: dict[int, seccomp.TypeRule] = {
    socket.SOCK_STREAM: frozenset({0, socket.IPPROTO_TCP}),
    socket.SOCK_DGRAM: frozenset({0, socket.IPPROTO_UDP, socket.IPPROTO_ICMP, 58}),  # 58: ICMPv6
}
_SUPERVISED_CALLS = ("connect", "sendto", "sendmsg", "sendmmsg")


def filter_spec(mode: Mode, unix_listed: bool) -> seccomp.FilterSpec:
    """The socket rules of one mode (see the module docstring)."""
    unix: seccomp.FamilyRule = dict(seccomp.STREAMS) if unix_listed else False
    if mode == "closed":
        return seccomp.FilterSpec(seccomp.SocketRules({}, other=False))
    if mode == "open":
        rules = seccomp.SocketRules({socket.AF_UNIX: unix}, other=True)
        return seccomp.FilterSpec(rules, notify_connect=unix_listed)
    families: dict[int, seccomp.FamilyRule] = {
        socket.AF_INET: _IP_TYPES,
        socket.AF_INET6: _IP_TYPES,
        socket.AF_UNIX: unix,
    }
    return seccomp.FilterSpec(
        seccomp.SocketRules(families, other=False),
        notify_connect=True,
        notify_sends=True,
        outbound_only=True,
    )


@record(slots=True)
class NetGuard:
    """One configuration's network wall: the filter each spawn installs and, when it
    supervises, what its supervisor allows."""

    mode: Mode
    unix: UnixList
    public: PublicOnly | None
    user: tuple[int, int] | None  # the tools' uid and gid when Parley drops to them
    program: bytes = b""
    policy: Policy | None = field(default=None)  # set when connects are supervised

    def __post_init__(self) -> None:
        spec = filter_spec(self.mode, bool(self.unix))
        self.program = seccomp.build(spec)
        if spec.notify_connect:
            from core.sandbox.netcall import Policy
            from core.sandbox.netsupervisor import SUPERVISOR

            assert seccomp.ARCH is not None
            calls = {seccomp.ARCH.nr[name]: name for name in _SUPERVISED_CALLS}
            self.policy = Policy(self.unix, self.public, self.user, calls)
            SUPERVISOR.start()  # here, in an unconfined thread; `install` runs confined

    @property
    def supervised(self) -> bool:
        return self.policy is not None

    def install(self) -> Listener | None:
        """Enforce the filter on the calling thread (after `no_new_privs`); its
        listener, already served, when it supervises."""
        fd = seccomp.install(self.program, listener=self.policy is not None)
        if self.policy is None:
            return None
        from core.sandbox.netsupervisor import SUPERVISOR

        return SUPERVISOR.watch(fd, self.policy)

    @staticmethod
    def release(listener: Listener | None) -> None:
        """The spawn is over: stop serving `listener`. A process that outlived it gets
        ENOSYS from then on."""
        if listener is not None:
            from core.sandbox.netsupervisor import SUPERVISOR

            SUPERVISOR.release(listener)


# --- the configuration ------------------------------------------------------------------------


def mode_of(network: bool | str) -> Mode:
    return "public" if network == "public" else "open" if network else "closed"


def guard_for(settings: SandboxSettings, abi: int, user: tuple[int, int] | None) -> NetGuard | None:
    """The network wall for `settings`; None when nothing is confined, or the host has
    no seccomp filters (then only Landlock's TCP rules apply).

    Raises:
        ConfigError: `network = "public"` where the host cannot enforce it; a relative or
            useless `unix_sockets` entry, or one the kernel cannot supervise.
    """
    mode, listed = mode_of(settings.network), settings.unix_sockets
    if mode == "public" and (settings.sandbox == "off" or abi == 0):
        why = (
            'tools.sandbox = "off"' if settings.sandbox == "off" else "this kernel has no Landlock"
        )
        raise ConfigError(
            "tools.network",
            f'"public" needs the kernel sandbox, but {why}',
            'use a kernel with Landlock and tools.sandbox = "auto", or network = true',
        )
    for path in listed:
        if not os.path.isabs(os.path.expanduser(path)):
            raise ConfigError(
                "tools.unix_sockets", f"`{path}` is not an absolute path", "give its full path"
            )
    if listed and mode == "closed":
        raise ConfigError(
            "tools.unix_sockets",
            "sockets are listed, but network = false closes every socket",
            "remove them, or set network = true",
        )
    if settings.sandbox == "off" or abi == 0:
        return None
    supervised = mode == "public" or bool(listed)
    if supervised and not seccomp.supervision_available():
        key = "tools.network" if mode == "public" else "tools.unix_sockets"
        raise ConfigError(
            key,
            "this kernel cannot check sockets for the tools (seccomp user notification and "
            "pidfd_getfd, Linux 5.6+, are missing)",
            "use a newer kernel, or network = true with no unix_sockets",
        )
    if not seccomp.filters_available():
        return None
    public = PublicOnly(nameservers()) if mode == "public" else None
    return NetGuard(mode, UnixList.of(listed), public, user)


def handled_net(network: bool | str, guard: NetGuard | None) -> int:
    """The Landlock network rights to handle (with no rule: denied). Closed: TCP bind
    and connect; public: the same, so no tool is a TCP server (the supervisor connects for
    it). Otherwise supervised: TCP connect, so only the supervisor's own connects, made
    outside the tool's domain, succeed — a second wall behind the filter."""
    if mode_of(network) in ("closed", "public"):
        return landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
    return landlock.NET_CONNECT_TCP if guard is not None and guard.supervised else 0


def describe(network: bool | str, guard: NetGuard | None, abi: int) -> str:
    """The network part of the start-up line: what is enforced."""
    mode = mode_of(network)
    if mode == "closed":
        if guard is not None:
            return "network closed (no socket but a unix socketpair)"
        if abi >= 4:
            return "network closed to TCP only (no seccomp here: UDP and unix sockets stay open)"
        return "network open (this kernel cannot close it)"
    if guard is None:
        return "network open (no seccomp here: unix sockets stay open)"
    listed = sorted(set(guard.unix.paths.values()))
    unix = f"unix sockets: only {', '.join(listed)}" if listed else "unix sockets: none"
    if mode == "open":
        return f"network open; {unix}"
    assert guard.public is not None
    dns = ", ".join(str(ip) for ip in sorted(guard.public.resolvers, key=str)) or "none"
    return (
        "network public (no loopback, private, link-local or metadata addresses; "
        f"DNS to {dns} port 53); {unix}"
    )
