"""A TCP proxy in front of a server (PostgreSQL) that can hold one client's write at the wire:
a store whose commit is slow to arrive, as over a congested network. Its line can also be
cut and mended: `cut()` closes every connection through it and refuses new ones (as a
network partition does to the client), `mend()` lets connections through again.

Once `arm`ed with a marker, the first chunk a client sends that contains it — and whatever
that connection sends after it — waits until `release()`; `drop()` instead closes that
connection without ever sending it, so the server rolls its transaction back, as when the
client dies with its commit unsent. Other connections (reads, listeners) go on meanwhile.
The marker is plain bytes of the client's messages: SQL text, which PostgreSQL's protocol
carries in the clear the first time a statement is sent (unless TLS is on: connect with
`sslmode=disable`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self
from urllib.parse import urlsplit, urlunsplit


class HoldingProxy:
    """Listens on 127.0.0.1 and forwards every connection to `host:port`."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.held = asyncio.Event()  # set once a chunk with the marker is held
        self._marker: bytes | None = None
        self._go_on = asyncio.Event()
        self._dropped = False
        self.cut_off = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Future[None]] = set()  # the pumps
        self._ends: list[asyncio.StreamWriter] = []  # every socket, closed on leaving

    @classmethod
    def before(cls, url: str) -> Self:
        """A proxy in front of the server of `url`."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url(self, url: str) -> str:
        """`url`, through this proxy, without TLS (the marker must be readable)."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        query = f"{parts.query}&sslmode=disable" if parts.query else "sslmode=disable"
        netloc = f"{user}127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
        for end in self._ends:
            end.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)

    def arm(self, marker: bytes) -> None:
        """Hold the next chunk any client sends that contains `marker` (once)."""
        self._marker = marker

    def release(self) -> None:
        """Send what is held, and let that connection go on."""
        self._go_on.set()

    def drop(self) -> None:
        """Close the held connection without sending what is held."""
        self._dropped = True
        self._go_on.set()

    def cut(self) -> None:
        """Close every connection through the proxy and refuse new ones until `mend()`."""
        self.cut_off = True
        for end in self._ends:
            end.close()
        self._ends.clear()

    def mend(self) -> None:
        self.cut_off = False

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        self._ends.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._ends.append(up_writer)
        pumps = {
            asyncio.ensure_future(self._client_to_server(reader, up_writer)),
            asyncio.ensure_future(_pump(up_reader, writer)),
        }
        self._tasks |= pumps
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            writer.close()
            up_writer.close()

    async def _client_to_server(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter
    ) -> None:
        tail, holding = b"", False
        with contextlib.suppress(OSError):  # the line was cut
            while chunk := await reader.read(65536):
                marker = self._marker
                if marker is not None and not holding and marker in tail + chunk:
                    self._marker, holding = None, True
                    self.held.set()
                if holding:
                    await self._go_on.wait()
                    if self._dropped:
                        return
                up.write(chunk)
                await up.drain()
                tail = chunk[-64:]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):  # the line was cut
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
