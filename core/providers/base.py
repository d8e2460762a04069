"""What every provider shares: HTTP + SSE streaming, retries, error mapping, fragment merging.

A provider subclass only knows its wire format: how to build the request body from our
messages (`build_body`) and how to turn one SSE event into stream events (`parse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from core.clock import Clock, SystemClock
from core.errors import (
    ContextLengthError,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)
from core.events import (
    EventSink,
    ReasoningDelta,
    StreamDone,
    StreamEvent,
    StreamRestarted,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from core.messages import Message, ToolCall
from core.tools.base import ToolSpec

# An error is sorted by its code (or type) first, then by HTTP status, and only then by
# its message: one table for HTTP error answers and in-stream error events alike.
CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded"})
AUTH_CODES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
RATE_LIMIT_CODES = frozenset(
    {"rate_limit_exceeded", "rate_limit_error", "rate_limited", "requests", "tokens"}
)
UNAVAILABLE_CODES = frozenset(
    {
        "server_error",
        "api_error",
        "internal_error",
        "internal_server_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
        "timeout",
    }
)
CONTEXT_LENGTH_MARKERS = (
    "context_length",
    "context length",
    "maximum context",
    "maximum context length",
    "prompt is too long",
    "too many tokens",
    "exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
    "exceeds the context window",  # OpenAI Responses: "Your input exceeds the context window"
    "context_length_exceeded",
)
REASONING_MARKERS = ("reasoning", "thinking", "thought")
DRAIN_SECONDS = 1.0


def is_reasoning_key(key: str) -> bool:
    lowered = key.lower()
    return any(marker in lowered for marker in REASONING_MARKERS)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """One configured endpoint: wire format, URL, credentials, model and limits."""

    name: str
    kind: str
    base_url: str
    model: str
    api_key: str | None = None
    context_window: int = 8192
    max_output_tokens: int = 4096
    temperature: float | None = None
    timeout: float = 120.0
    max_retries: int = 3


@dataclass(slots=True)
class MessageBuilder:
    """Accumulates one streamed assistant turn; tool-call fragments are merged by index."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_blocks: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, args...]
    index_map: dict[int, int] = field(default_factory=dict)  # wire item index -> call index
    reasoning_index: dict[int, int] = field(default_factory=dict)  # wire index -> block
    stop_reason: str = ""
    refused: bool = False  # the text is the model's refusal (stop reason "refusal")
    usage: Usage | None = None
    finished: bool = False

    def add(self, event: StreamEvent) -> None:
        match event:
            case TextDelta(text=text):
                self.text.append(text)
            case ReasoningDelta(text=text):
                self.reasoning.append(text)
            case ToolCallDelta(index=index, id=call_id, name=name, arguments=args):
                parts = self.calls.setdefault(index, ["", ""])
                if call_id:
                    parts[0] = call_id
                if name:
                    parts[1] = name
                if args:
                    parts.append(args)
            case Usage():
                self.usage = event
            case _:
                pass

    def has_output(self) -> bool:
        return bool(self.text or self.calls or self.reasoning)

    def message(self) -> Message:
        calls = tuple(
            # A server that sends no ids (some local ones) gets unique ones: ids must not
            # repeat across turns, or results and resume records would be confused.
            ToolCall(
                id=p[0] or f"call_{uuid.uuid4().hex[:12]}",
                name=p[1],
                arguments="".join(p[2:]) or "{}",
            )
            for _, p in sorted(self.calls.items())
        )
        return Message(
            role="assistant",
            content="".join(self.text),
            tool_calls=calls,
            reasoning="".join(self.reasoning),
            reasoning_blocks=tuple(self.reasoning_blocks),
        )


def error_from_response(status: int, body: str, headers: httpx.Headers) -> ProviderError:
    """Map an HTTP error answer to our error tree."""
    return provider_error(
        f"HTTP {status}", _error_object(body), status=status, retry_after=_retry_after(headers)
    )


def error_from_event(provider: str, error: Any) -> ProviderError:
    """Map an error sent inside a stream (an `error` event, a `{"error": {...}}` chunk, a
    failed response) to our error tree. `error` is the vendor's error object (or text)."""
    return provider_error(provider, error if isinstance(error, dict) else {"message": str(error)})


def provider_error(
    where: str,
    error: dict[str, Any],
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """The one mapping from a vendor's error object to our tree, with the server's own words
    (its message, its code, and what the model tried if Groq says so) as the message.

    Args:
        where: what the message starts with ("HTTP 400", the provider's name).
        error: `{"message", "type", "code", ...}`; an int `code` is an HTTP status, as
            OpenRouter sends it.
        status: the HTTP status, if the error came as an HTTP answer.
        retry_after: seconds from a Retry-After header.
    """
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int) and not isinstance(code, bool):
        status, code = status or code, None
    said = str(error.get("message") or error.get("reason") or kind or error)[:500]
    labels = {str(v).lower() for v in (code, kind) if v}
    error_cls = _error_class(labels, status, said)
    text = f"{where}: {said}"
    if isinstance(code, str) and code and code not in said:
        text += f" ({code})"
    if failed := error.get("failed_generation"):
        text += f"\nfailed_generation: {str(failed)[:300]}"
    label = str(code or kind) if code or kind else None
    return error_cls(text, status=status, retry_after=retry_after, code=label)


def _error_class(labels: set[str], status: int | None, said: str) -> type[ProviderError]:
    """A context-overflow code first, then the code or type and the HTTP status (auth, rate
    limit, server trouble), and only then the server's message."""
    if labels & CONTEXT_LENGTH_CODES:
        return ContextLengthError
    if status in (401, 403) or labels & AUTH_CODES:
        return ProviderAuthError
    if status == 429 or labels & RATE_LIMIT_CODES:
        return ProviderRateLimited
    if status in (408, 409, 425) or (status or 0) >= 500 or labels & UNAVAILABLE_CODES:
        return ProviderUnavailable
    if any(marker in said.lower() for marker in CONTEXT_LENGTH_MARKERS):
        return ContextLengthError
    return ProviderError


def _error_object(body: str) -> dict[str, Any]:
    """The error object of an HTTP error body (OpenAI, Anthropic and plainer shapes)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {"message": body[:500] or "(empty body)"}
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return error
    return {"message": str(error)}


def _retry_after(headers: httpx.Headers) -> float | None:
    for key, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(key)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


def backoff_delay(attempt: int, retry_after: float | None, *, base: float = 1.0) -> float:
    """Exponential backoff with full jitter; a server's Retry-After wins (capped at 60 s)."""
    if retry_after is not None:
        return min(retry_after, 60.0) + random.uniform(0, 0.1)
    return float(min(base * 2**attempt, 30.0) * random.uniform(0.5, 1.0))


class Provider(ABC):
    """An LLM endpoint that streams one assistant turn at a time."""

    path: str = ""

    def __init__(
        self,
        settings: ProviderSettings,
        client: httpx.AsyncClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._client = client
        self._owns_client = client is None

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            timeout = httpx.Timeout(self.settings.timeout, connect=10.0)
            # Keep every pooled connection alive: with httpx's default of 20 kept-alive
            # connections, many busy conversations open a new TCP (and TLS) connection
            # for most LLM calls.
            limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None

    @abstractmethod
    def build_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The JSON request body for this wire format."""

    def headers(self) -> dict[str, str]:
        """Authentication and version headers (Bearer auth, as OpenAI-style APIs use)."""
        return {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}

    @abstractmethod
    def parse(self, event: str, data: str, acc: MessageBuilder) -> list[StreamEvent]:
        """Turn one SSE event into stream events; set `acc.finished` at the end of the turn."""

    def url(self) -> str:
        return self.settings.base_url.rstrip("/") + self.path

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        sink: EventSink | None = None,
    ) -> StreamDone:
        """One whole assistant turn: `stream`, each event to `sink`, the final `StreamDone`.
        A cancel closes the stream, and with it the HTTP response, at once."""
        async with contextlib.aclosing(self.stream(messages, tools)) as events:
            async for event in events:
                if sink is not None:
                    sink(event)
                if isinstance(event, StreamDone):
                    return event
        raise AssertionError("provider stream ended without StreamDone")  # pragma: no cover

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream one assistant turn, retrying transient failures; ends with `StreamDone`.

        A stream cut after some output is retried too: `StreamRestarted` tells the caller
        to discard what it showed of the failed attempt.
        """
        body = self.build_body(messages, tools)
        attempt = 0
        while True:
            acc = MessageBuilder()
            try:
                async for event in self._stream_once(body, acc):
                    yield event
                stop_reason = "refusal" if acc.refused else acc.stop_reason or "stop"
                yield StreamDone(acc.message(), stop_reason, acc.usage)
                return
            except ProviderError as exc:
                if not exc.retryable or attempt >= self.settings.max_retries:
                    raise
                delay = backoff_delay(attempt, exc.retry_after)
                attempt += 1
                yield StreamRestarted(attempt, str(exc), delay, acc.has_output())
                await self.clock.sleep(delay)

    async def _stream_once(
        self, body: dict[str, Any], acc: MessageBuilder
    ) -> AsyncIterator[StreamEvent]:
        headers = {"Accept": "text/event-stream", **self.headers()}
        try:
            async with self.client.stream("POST", self.url(), json=body, headers=headers) as resp:
                if resp.status_code >= 400:
                    raw = (await resp.aread()).decode("utf-8", "replace")
                    raise error_from_response(resp.status_code, raw, resp.headers)
                events = EventSource(resp).aiter_sse()
                async for sse in events:
                    for event in self.parse(sse.event, sse.data, acc):
                        acc.add(event)
                        yield event
                    if acc.finished:
                        await _drain(events)
                        return
        except httpx.TimeoutException as exc:
            raise ProviderUnavailable(f"timed out talking to {self.name}: {exc!r}") from exc
        except (httpx.TransportError, SSEError) as exc:
            raise ProviderUnavailable(f"connection to {self.name} failed: {exc!r}") from exc
        raise ProviderUnavailable(f"{self.name} ended the stream before the turn was complete")


async def _drain(events: AsyncIterator[object]) -> None:
    """Read what follows the end-of-turn event, so the connection goes back to the pool
    instead of being closed (a new TCP + TLS handshake per LLM call otherwise)."""
    with contextlib.suppress(TimeoutError, httpx.HTTPError, SSEError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in events:
                pass


def decode_json(data: str, provider: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ProviderUnavailable(
            f"{provider} sent a malformed stream event: {data[:200]}"
        ) from exc
