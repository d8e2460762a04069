"""A TCP proxy in front of a server (PostgreSQL) whose line can be cut and mended: `cut()`
closes every connection through it and refuses new ones (as a network partition does to
the client), `mend()` lets connections through again."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self
from urllib.parse import urlsplit, urlunsplit


class CuttingProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.cut_off = False
        self._server: asyncio.Server | None = None
        self._ends: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    @classmethod
    def before(cls, url: str) -> Self:
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url(self, url: str) -> str:
        """`url`, through this proxy."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        netloc = f"{user}127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def cut(self) -> None:
        self.cut_off = True
        for end in list(self._ends):
            end.close()
        self._ends.clear()

    def mend(self) -> None:
        self.cut_off = False

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._ends.update((writer, up_writer))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()
        sink.close()
        self._ends.discard(sink)
