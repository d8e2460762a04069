"""`web_fetch`'s HTTP: only http(s), only public addresses, on every hop.

`web_fetch` runs in Parley's own process, outside the tools' sandbox, so this check is the
wall: a model steered by a page must not reach loopback, the private network or a cloud
metadata service through it. For each connection the host name is resolved once, every
address it resolves to is checked (`core.sandbox.netpolicy.is_public`, the same rule as
`network = "public"`), and the connection is made to the checked address itself — there
is no second lookup a rebinding DNS server could answer differently. Redirects are
followed by hand, each target checked the same way. No proxy from the environment is
used (it would connect on our behalf, past the check), and responses are asked for
uncompressed, so the size limit counts what the server sends.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import field
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

import httpcore2
import idna

from core.errors import ToolDenied, ToolError, ToolTransientError
from core.records import record
from core.sandbox.netpolicy import IPAddress, is_public

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
AddressRule = Callable[[IPAddress, int], bool]
REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "Parley-web_fetch/1 (+https://github.com/parley)"
_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?")
# what stays as it is in a path or query; everything else (spaces, non-ASCII) is %-encoded
_URL_SAFE = "!$%&'()*+,/:;=?@[]~"


class FetchRefused(ToolDenied):
    """A URL or an address `web_fetch` will not reach; the message says which and why."""


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system's resolver gives for `host` (numeric forms such as
    `2130706433` or `0x7f.1` come back as the address they spell)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve {host}: {exc.strerror}") from exc
    return [ipaddress.ip_address(str(info[4][0])) for info in infos]


def public_only(ip: IPAddress, port: int) -> bool:
    """The production rule: public addresses only, on any port."""
    return is_public(ip)


class CheckedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to addresses the rule allows: resolves once, checks every address,
    connects to the first (by address, so nothing resolves the name again)."""

    def __init__(self, resolve: Resolver, allow: AddressRule) -> None:
        self.resolve, self.allow = resolve, allow
        self.inner = httpcore2.AnyIOBackend()
        self.connected: list[tuple[str, int]] = []  # (address, port) of each connection

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await self.resolve(host.strip("[]"), port)
        if not addresses:
            raise ToolError(f"cannot resolve {host}: no address")
        for ip in addresses:
            if not self.allow(ip, port):
                shown = host if str(ip) == host.strip("[]") else f"{host} ({ip})"
                raise FetchRefused(
                    f"refused: {shown} is not a public address (loopback, private, "
                    "link-local and metadata addresses are never fetched)"
                )
        target = str(addresses[0])
        self.connected.append((target, port))
        return await self.inner.connect_tcp(
            target, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options,
        )  # fmt: skip

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's interface)
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise FetchRefused("refused: unix sockets are never fetched")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def checked_url(url: str) -> str:
    """`url` if `web_fetch` may try it (http or https, a host, no credentials), in ASCII:
    the host as a browser would write it (`ascii_host`), the rest percent-encoded.

    Raises:
        FetchRefused: another scheme, no host or an invalid one, or a user name or
            password in it.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises on a port that is not a number
    except ValueError as exc:
        raise FetchRefused(f"refused: `{url}` is not a valid URL ({exc})") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise FetchRefused(f"refused: only http and https URLs are fetched, not `{parts.scheme}:`")
    if not parts.hostname:
        raise FetchRefused(f"refused: `{url}` names no host")
    if parts.username is not None or parts.password is not None:
        raise FetchRefused("refused: URLs with a user name or password are not fetched")
    host = ascii_host(parts.hostname)
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{port}" if port is not None else ""
    # the fragment never goes over HTTP; the rest is sent as ASCII, like a browser does
    path = quote(parts.path or "/", safe=_URL_SAFE)
    query = quote(parts.query, safe=_URL_SAFE)
    return urlunsplit((parts.scheme.lower(), netloc, path, query, ""))


def ascii_host(host: str) -> str:
    """`host` as the WHATWG URL standard turns it into ASCII before it is looked up:
    percent-decoded, then mapped by UTS #46 (NFKC, case folded, `。`/`．`/`｡` become
    dots) and IDNA-encoded; an IPv6 literal as it is.

    So `１２７．０．０．１` is `127.0.0.1` here, as in a browser, and meets the address
    rule like any other spelling.

    Raises:
        FetchRefused: a host no browser would accept (a character not allowed in a
            host name, an invalid IDNA label, an invalid IPv6 literal).
    """
    if ":" in host:  # urlsplit took the brackets off an IPv6 literal
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError as exc:
            raise FetchRefused(f"refused: `[{host}]` is not a valid IPv6 address") from exc
    try:
        name = unquote(host, errors="strict")
        if not name.isascii():
            mapped = idna.uts46_remap(name, std3_rules=False)
            name = ".".join(
                label if label.isascii() else idna.alabel(label).decode("ascii")
                for label in mapped.split(".")
            )
    except (UnicodeError, idna.IDNAError) as exc:
        raise FetchRefused(f"refused: `{host}` is not a valid host name ({exc})") from exc
    if not _HOST_NAME.fullmatch(name):
        raise FetchRefused(f"refused: `{host}` is not a valid host name")
    if name.endswith(".") and _is_ipv4(name[:-1]):
        name = name[:-1]  # `127.0.0.1.` is an address to a browser, not a name to look up
    return name.lower()


def _is_ipv4(name: str) -> bool:
    """`name` is an IPv4 address in one of the forms C and browsers read (`127.1`,
    `0x7f.1`, `2130706433` …)."""
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


@record(frozen=True, slots=True)
class Fetched:
    """A response: the URL it came from (after redirects), status, type and body."""

    url: str
    status: int
    content_type: str
    body: bytes
    cut: bool  # the body went on past the size limit
    redirects: tuple[str, ...] = field(default=())


@record(slots=True)
class Fetcher:
    """Fetches with the address rule `allow` (production: public addresses only).

    `resolve` and `allow` are constructor arguments only: no configuration key reaches
    them. Tests pass their own to fetch from a server on 127.0.0.1.
    """

    max_bytes: int = 2_000_000
    timeout: float = 20.0
    max_redirects: int = 5
    resolve: Resolver = system_resolver
    allow: AddressRule = public_only

    async def fetch(self, url: str) -> Fetched:
        """GET `url`, following redirects, within the time and size limits.

        Raises:
            FetchRefused: a URL or address that is not allowed, on any hop.
            ToolError: the fetch failed or took too long.
        """
        backend = CheckedBackend(self.resolve, self.allow)
        try:
            async with (
                asyncio.timeout(self.timeout),
                httpcore2.AsyncConnectionPool(
                    network_backend=backend, retries=0, max_connections=2
                ) as pool,
            ):
                return await self._follow(pool, checked_url(url))
        except TimeoutError:
            raise ToolError(f"fetching {url} took longer than {self.timeout:g} s") from None
        except httpcore2.ConnectError as exc:
            raise ToolTransientError(f"cannot connect for {url}: {exc}") from exc
        except (httpcore2.NetworkError, httpcore2.ProtocolError) as exc:
            raise ToolError(f"fetching {url} failed: {exc or type(exc).__name__}") from exc
        except httpcore2.UnsupportedProtocol as exc:
            raise FetchRefused(f"refused: {exc}") from exc

    async def _follow(self, pool: httpcore2.AsyncConnectionPool, url: str) -> Fetched:
        hops: list[str] = []
        limits = {"connect": self.timeout, "read": self.timeout, "write": self.timeout}
        headers = [
            ("User-Agent", USER_AGENT),
            ("Accept", "text/html, text/*;q=0.9, application/json;q=0.8, */*;q=0.1"),
            ("Accept-Encoding", "identity"),
        ]
        while True:
            async with pool.stream(
                "GET", url, headers=headers, extensions={"timeout": {**limits, "pool": 5.0}}
            ) as response:
                location = _header(response, b"location")
                if response.status in REDIRECTS and location:
                    if len(hops) >= self.max_redirects:
                        raise ToolError(f"more than {self.max_redirects} redirects from {url}")
                    hops.append(url)
                    url = checked_url(urljoin(url, location))
                    continue
                body, cut = await self._body(response)
                content_type = _header(response, b"content-type") or ""
                return Fetched(url, response.status, content_type, body, cut, tuple(hops))

    async def _body(self, response: httpcore2.Response) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                return b"".join(chunks)[: self.max_bytes], True
        return b"".join(chunks), False


def _header(response: httpcore2.Response, name: bytes) -> str | None:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


__all__ = [
    "CheckedBackend",
    "FetchRefused",
    "Fetched",
    "Fetcher",
    "ascii_host",
    "checked_url",
    "public_only",
    "system_resolver",
]
