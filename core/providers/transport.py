"""The endpoint: where an LLM lives, how we connect to it and how we retry it.

Nothing here knows a wire format: `Endpoint.sse` posts a JSON body and yields the
server-sent events of the answer, with HTTP error answers and transport failures mapped
to `core.errors` (by `core.providers.errors`); `retrying` runs a streamed call again
after transient failures, sleeping on the injected `Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import ssl
import weakref
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import httpx2
from httpx2 import EventSource, ServerSentEvent, SSEError

from core.clock import Clock, SystemClock
from core.errors import ProviderError
from core.events import ReasoningDelta, StreamEvent, StreamRestarted, TextDelta, ToolCallDelta
from core.providers.base import ProviderSettings
from core.providers.errors import error_from_response, map_transport_errors
from core.providers.jsonbody import encode_body

DRAIN_SECONDS = 1.0
CONNECT_TIMEOUT = 10.0
OUTPUT_EVENTS = (TextDelta, ReasoningDelta, ToolCallDelta)  # what a retry must discard
POOL_STREAMS = 64
"""Streams one connection pool carries before another is opened beside it. httpcore's
pool looks at each of its connections on every request, so with one connection per
concurrent conversation that bookkeeping grows with their square: at 1,000 at once it
took most of the CPU (docs/benchmarks.md, 1,000 concurrent conversations)."""


STARTS_PER_TICK = 2
"""LLM requests that start per turn of the event loop (`SendGate`)."""


class SendGate:
    """Paces the start of LLM requests: at most `per_tick` start in one turn of the event
    loop, the others wait their turn in order (docs/providers.md, "Pacing").

    An answer already streaming is someone waiting to read it; a new request is not yet.
    When the loop is saturated (hundreds of conversations in their tool loops at once),
    requests started without pacing were answered together, and every answer then waited
    behind all the others' work in one long turn of the loop: the first streamed text
    took a quarter of a second at 200 conversations and seconds at 1,000. Paced, each
    turn of the loop stays short, and an answer is read as it arrives. An idle loop never
    makes a request wait: the first `per_tick` of a turn pass at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, per_tick: int = STARTS_PER_TICK) -> None:
        self._loop = loop
        self.per_tick = per_tick
        self._left = per_tick
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._refill_due = False

    async def enter(self) -> None:
        """Return when this request may start (at once, unless this turn's are used up)."""
        if self._left > 0 and not self._waiters:
            self._left -= 1
            self._schedule_refill()
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        self._schedule_refill()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._left += 1  # its place goes to the next waiter, at the next refill
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def _schedule_refill(self) -> None:
        if not self._refill_due:
            self._refill_due = True
            self._loop.call_soon(self._refill)

    def _refill(self) -> None:
        """The next turn of the loop: new places, the first waiters take them."""
        self._refill_due = False
        self._left = self.per_tick
        while self._left > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._left -= 1
        if self._waiters or self._left < self.per_tick:
            self._schedule_refill()


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SendGate] = weakref.WeakKeyDictionary()


def send_gate() -> SendGate:
    """The running loop's gate, shared by every endpoint (the loop is what they share)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = SendGate(loop)
    return gate


def pool_limits(max_connections: int | None) -> httpx2.Limits:
    """The connection pool for one endpoint: `max_connections` (None: no cap), and every
    pooled connection kept alive. The defaults (100, 20 kept alive) made the 101st
    concurrent turn wait silently for a connection and opened a new TCP (and TLS)
    connection for most LLM calls of many busy conversations."""
    return httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every endpoint: loading the CA bundle takes ~27 ms,
    which each client paid again. A plain-HTTP endpoint (a local model) gets none."""
    return httpx2.create_ssl_context()


class Endpoint:
    """One configured LLM endpoint: base URL, credentials, pooled HTTP client, retries.

    Args:
        settings: URL, timeout, retries and pool size.
        headers: sent with every request (the wire format's auth and version headers).
        client: a shared client (benchmarks, tests); by default the endpoint builds and
            owns one, sized by `settings.max_connections`.
        clock: what retries sleep on.
    """

    def __init__(
        self,
        settings: ProviderSettings,
        headers: Mapping[str, str],
        client: httpx2.AsyncClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.headers = {
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
            **headers,
        }
        self.clock: Clock = clock or SystemClock()
        self._client = client
        self._owns_client = client is None
        self._more: list[httpx2.AsyncClient] = []  # pools opened beside the first
        self._streams: dict[httpx2.AsyncClient, int] = {}  # streams open, per pool

    @property
    def client(self) -> httpx2.AsyncClient:
        """The HTTP client (its first pool), built on first use."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> httpx2.AsyncClient:
        timeout = httpx2.Timeout(self.settings.timeout, connect=CONNECT_TIMEOUT)
        limits = pool_limits(self.settings.max_connections)
        verify = tls_context() if self.settings.base_url.startswith("https:") else False
        return httpx2.AsyncClient(timeout=timeout, limits=limits, verify=verify)

    def _pool(self) -> httpx2.AsyncClient:
        """The client for the next stream: the first pool carrying fewer than
        `POOL_STREAMS`, or a new one (only for an uncapped pool this endpoint owns; a cap
        is one pool's). Filled in order, each pool finds the connections it kept alive."""
        first = self.client
        if not self._owns_client or self.settings.max_connections is not None:
            return first
        for pool in (first, *self._more):
            if self._streams.get(pool, 0) < POOL_STREAMS:
                return pool
        self._more.append(self._new_client())
        return self._more[-1]

    async def aclose(self) -> None:
        """Close the clients if this endpoint built them."""
        if self._client is not None and self._owns_client:
            for client in (self._client, *self._more):
                await client.aclose()
            self._client, self._more = None, []

    def url(self, path: str) -> str:
        return self.settings.base_url.rstrip("/") + path

    @contextlib.asynccontextmanager
    async def sse(
        self, path: str, body: dict[str, Any]
    ) -> AsyncIterator[AsyncIterator[ServerSentEvent]]:
        """POST `body` to `path`; the server-sent events of the answer.

        Leaving the block normally reads what is left of the stream, so the connection
        goes back to the pool (a new TCP + TLS handshake per LLM call otherwise).

        Raises:
            ProviderError: an HTTP error answer, or a transport failure while connecting
                or reading (`ProviderUnavailable`).
        """
        name, cap = self.settings.name, self.settings.max_connections
        await send_gate().enter()
        client = self._pool()
        self._streams[client] = self._streams.get(client, 0) + 1
        try:
            with map_transport_errors(name, cap):
                content = encode_body(body)
                request = client.stream(
                    "POST", self.url(path), content=content, headers=self.headers
                )
                async with request as resp:
                    if resp.status_code >= 400:
                        raw = (await resp.aread()).decode("utf-8", "replace")
                        raise error_from_response(resp.status_code, raw, resp.headers)
                    events = aiter(EventSource(resp))
                    yield events
                    await _drain(events)
        finally:
            self._streams[client] -= 1


async def retrying(
    attempt: Callable[[], AsyncGenerator[StreamEvent, None]], max_retries: int, clock: Clock
) -> AsyncGenerator[StreamEvent, None]:
    """Run a streamed call, starting it again after a retryable `ProviderError` (at most
    `max_retries` times) with backoff; a server's Retry-After wins.

    Each retry is announced by `StreamRestarted`, whose `discard` says the failed attempt
    had already shown output.
    """
    retries = 0
    while True:
        shown = False
        try:
            async with contextlib.aclosing(attempt()) as events:
                async for event in events:
                    shown = shown or isinstance(event, OUTPUT_EVENTS)
                    yield event
            return
        except ProviderError as exc:
            if not exc.retryable or retries >= max_retries:
                raise
            delay = backoff_delay(retries, exc.retry_after)
            retries += 1
            yield StreamRestarted(retries, str(exc), delay, shown)
            await clock.sleep(delay)


def backoff_delay(attempt: int, retry_after: float | None, *, base: float = 1.0) -> float:
    """Exponential backoff with full jitter; a server's Retry-After wins (capped at 60 s)."""
    if retry_after is not None:
        return min(retry_after, 60.0) + random.uniform(0, 0.1)
    return float(min(base * 2**attempt, 30.0) * random.uniform(0.5, 1.0))


async def _drain(events: AsyncIterator[object]) -> None:
    """Read what follows the end-of-turn event, so the connection goes back to the pool
    instead of being closed."""
    with contextlib.suppress(TimeoutError, httpx2.HTTPError, SSEError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in events:
                pass
