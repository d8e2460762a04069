"""Where a tool's socket may go, decided on bytes the supervisor read once: which IP
destinations `network = "public"` allows, and which unix socket a listed path names.

Pure functions over copies, so they can be tested on their own; the supervisor
(core/sandbox/netguard.py) feeds them and acts on the answer.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path

from core.records import record

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4_BLOCKED = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network", incl. the unspecified address
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, incl. cloud metadata 169.254.169.254
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, incl. broadcast
    )
)
_V6_GLOBAL = ipaddress.IPv6Network("2000::/3")
_V6_BLOCKED = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "2001::/23",  # IETF protocol assignments, incl. Teredo 2001::/32
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
    )
)
_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
DNS_PORT = 53


def embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries to the IPv4 network: mapped (::ffff:a.b.c.d),
    NAT64 (64:ff9b::a.b.c.d) or 6to4 (2002:aabb:ccdd::)."""
    if ip in _V4_MAPPED or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)
    return None


def is_public(ip: IPAddress) -> bool:
    """True for an address on the public internet: not loopback, private, link-local,
    CGNAT, unspecified, multicast, documentation or reserved, in any IPv6 form."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            return is_public(inner)
        return ip in _V6_GLOBAL and not any(ip in net for net in _V6_BLOCKED)
    return not any(ip in net for net in _V4_BLOCKED)


def nameservers(path: str = "/etc/resolv.conf") -> frozenset[IPAddress]:
    """The `nameserver` addresses of resolv.conf (none when it is unreadable)."""
    found: set[IPAddress] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        found.add(ipaddress.ip_address(parts[1].split("%")[0]))
                    except ValueError:
                        continue
    except OSError:
        pass
    return frozenset(found)


@record(frozen=True, slots=True)
class Destination:
    """An IP destination parsed from a sockaddr: `ip` None means "no destination" (an
    AF_UNSPEC connect, which disconnects)."""

    ip: IPAddress | None
    port: int = 0


def parse_inet(domain: int, raw: bytes, *, connect: bool) -> Destination:
    """The destination the kernel would use for `raw` on a socket of `domain`.

    Read as the kernel reads it: an AF_INET6 socket also takes AF_INET addresses, and a
    UDP send reads an AF_UNSPEC address as AF_INET. A connect to AF_UNSPEC disconnects.

    Raises:
        ValueError: too short, or a family the socket would not take.
    """
    if len(raw) < 2:
        raise ValueError("address too short")
    family = struct.unpack_from("=H", raw)[0]
    if family == socket.AF_UNSPEC and (connect or domain == socket.AF_INET6):
        return Destination(None)
    if family == socket.AF_INET6 and domain == socket.AF_INET6:
        if len(raw) < 24:
            raise ValueError("sockaddr_in6 too short")
        return Destination(ipaddress.IPv6Address(raw[8:24]), struct.unpack_from("!H", raw, 2)[0])
    if family in (socket.AF_INET, socket.AF_UNSPEC):
        if len(raw) < 16:
            raise ValueError("sockaddr_in too short")
        return Destination(ipaddress.IPv4Address(raw[4:8]), struct.unpack_from("!H", raw, 2)[0])
    raise ValueError(f"address family {family} on a socket of family {domain}")


@record(frozen=True, slots=True)
class PublicOnly:
    """The `network = "public"` rule: public addresses, plus the resolvers of
    /etc/resolv.conf on port 53 (often on loopback or a private network) so names
    resolve."""

    resolvers: frozenset[IPAddress] = field(default_factory=frozenset)

    def allows(self, dest: Destination) -> bool:
        if dest.ip is None:
            return True
        if dest.port == DNS_PORT and self._resolver(dest.ip):
            return True
        return is_public(dest.ip)

    def _resolver(self, ip: IPAddress) -> bool:
        if ip in self.resolvers:
            return True
        inner = embedded_v4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        return inner is not None and inner in self.resolvers


def unix_path(raw: bytes) -> str | None:
    """The pathname of a sockaddr_un; None for an abstract or unnamed address."""
    name = raw[2:]
    if not name or name[0] == 0:
        return None
    return os.fsdecode(name.split(b"\0", 1)[0])


@record(frozen=True, slots=True)
class UnixList:
    """`tools.unix_sockets`: each listed path, as written and resolved at start-up, maps
    to the resolved path. A tool names a socket by either; the supervisor then opens the
    resolved path refusing every symlink, so a link planted later is not followed."""

    paths: dict[str, str]

    @classmethod
    def of(cls, listed: Iterable[Path]) -> UnixList:
        paths: dict[str, str] = {}
        for entry in listed:
            written = os.path.normpath(os.path.expanduser(entry))
            resolved = os.path.realpath(written)
            paths[written] = paths[resolved] = resolved
        return cls(paths)

    def target(self, path: str) -> str | None:
        """The resolved listed path `path` names, or None (not listed)."""
        if not path.startswith("/"):
            return None
        return self.paths.get(os.path.normpath(path))

    def __bool__(self) -> bool:
        return bool(self.paths)
