"""A provider over HTTP: one `Endpoint`, one `WireFormat`, the `ResponseBuilder`."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx2

from core.clock import Clock
from core.errors import ProviderError, ProviderUnavailable
from core.events import EventSink, StreamDone, StreamEvent
from core.messages import Message
from core.providers.base import (
    CACHE_SCOPE,
    ProviderSettings,
    WireFormat,
    complete,
    prompt_cache_key,
)
from core.providers.builder import ResponseBuilder
from core.providers.errors import error_from_event, malformed_event
from core.providers.transport import Endpoint, retrying
from core.providers.wire import Malformed, WireError
from core.tools.base import ToolSpec

FAILURES = (WireError, Malformed)


class HTTPProvider:
    """An LLM endpoint that streams one assistant turn at a time (`Provider`).

    Args:
        settings: the configured endpoint.
        wire: its API's wire format.
        client: a shared HTTP client; by default the provider owns one.
        clock: what retries sleep on.
    """

    def __init__(
        self,
        settings: ProviderSettings,
        wire: WireFormat,
        client: httpx2.AsyncClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.wire = wire
        self.endpoint = Endpoint(settings, wire.headers(settings.api_key), client, clock)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def client(self) -> httpx2.AsyncClient:
        return self.endpoint.client

    async def aclose(self) -> None:
        await self.endpoint.aclose()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        sink: EventSink | None = None,
    ) -> StreamDone:
        """One whole assistant turn: each event of `stream` to `sink`, the `StreamDone`."""
        return await complete(self.stream(messages, tools), sink)

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream one assistant turn, retrying transient failures; ends with `StreamDone`.

        A stream cut after some output is retried too: `StreamRestarted` tells the caller
        to discard what it showed of the failed attempt.
        """
        body = self.wire.build_body(messages, tools, self.settings)
        scope = CACHE_SCOPE.get()
        if scope and self.settings.prompt_cache_key and getattr(self.wire, "cache_key", False):
            body = {"prompt_cache_key": prompt_cache_key(scope), **body}  # before the history
        return retrying(lambda: self._attempt(body), self.settings.max_retries, self.endpoint.clock)

    async def _attempt(self, body: dict[str, Any]) -> AsyncGenerator[StreamEvent, None]:
        """One try: the events of one HTTP answer, then its `StreamDone`."""
        acc = ResponseBuilder()
        parse = self.wire.parse
        async with self.endpoint.sse(self.wire.path, body) as events:
            async for sse in events:
                for wire_event in parse(sse.event, sse.data):
                    if isinstance(wire_event, FAILURES):
                        raise self._failure(wire_event)
                    if (event := acc.add(wire_event)) is not None:
                        yield event
                if acc.finished:
                    break
        if not acc.finished:
            raise ProviderUnavailable(f"{self.name} ended the stream before the turn was complete")
        yield acc.done()

    def _failure(self, event: WireError | Malformed) -> ProviderError:
        """An error the server sent inside the stream, or a broken event, mapped."""
        if isinstance(event, WireError):
            return error_from_event(self.name, event.error)
        return malformed_event(self.name, event.data)
