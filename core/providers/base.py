"""The provider seams: what the loop calls (`Provider`) and what a wire format is (`WireFormat`).

```
Provider  (what core.loop, core.context, core.agent.goals call)
├── HTTPProvider    core.providers.http: one Endpoint + one WireFormat + the ResponseBuilder
└── ScriptedProvider core.providers.scripted: in-process, for agent-level tests
WireFormat (pure: messages → body, one SSE event → wire events)
├── OPENAI_CHAT      core.providers.openai_chat
├── OPENAI_RESPONSES core.providers.openai_responses
└── ANTHROPIC        core.providers.anthropic
```
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

from core.events import EventSink, StreamDone, StreamEvent
from core.messages import Message
from core.providers.wire import WireEvent
from core.records import record
from core.tools.base import ToolSpec


@record(frozen=True, slots=True)
class ProviderSettings:
    """One configured endpoint: wire format, URL, credentials, model and limits.

    `max_connections` caps the connections (and the kept-alive ones) to this endpoint;
    None, the default, is no cap: every conversation runs its turn at once, so a fixed
    pool would make the surplus wait silently for a free connection.
    """

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
    max_connections: int | None = None
    prompt_cache_key: bool = True  # send OpenAI's `prompt_cache_key` (docs/cost.md)


CACHE_SCOPE: ContextVar[str] = ContextVar("prompt_cache_scope", default="")
"""The conversation the current LLM call is for (set by the loop around each call): the
OpenAI wire formats send a hash of it as `prompt_cache_key`, so one conversation's calls
reach the same cache (docs/cost.md#prompt-caching)."""


def prompt_cache_key(scope: str) -> str:
    """What is sent for conversation `scope`: a hash, so no conversation id leaves."""
    return "parley-" + hashlib.sha256(scope.encode()).hexdigest()[:24]


class Provider(Protocol):
    """An LLM that streams one assistant turn at a time."""

    @property
    def name(self) -> str:
        """The configured name (`[providers.NAME]`)."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def settings(self) -> ProviderSettings: ...

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream one assistant turn; transient failures are retried (`StreamRestarted`
        says so) and the last event is `StreamDone`.

        Raises:
            ProviderError: a permanent failure, or a transient one past the retries.
        """
        ...

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        sink: EventSink | None = None,
    ) -> StreamDone:
        """One whole assistant turn: each event of `stream` to `sink`, the `StreamDone`."""
        ...

    async def aclose(self) -> None:
        """Release connections; the provider is not used afterwards."""
        ...


class WireFormat(Protocol):
    """One vendor API's wire format. Pure: no I/O, no state between calls.

    Attributes:
        path: appended to the endpoint's base URL (`/chat/completions`).
    """

    path: str

    def headers(self, api_key: str | None) -> dict[str, str]:
        """How this API is told the key (and its version), for every request."""
        ...

    def build_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ProviderSettings
    ) -> dict[str, Any]:
        """The JSON request body for one streamed turn."""
        ...

    def parse(self, event: str, data: str) -> Iterable[WireEvent]:
        """The wire events of one server-sent event (its `event:` name and `data:` text)."""
        ...


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """Bearer auth, as OpenAI-style APIs take the key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def complete(
    events: AsyncGenerator[StreamEvent, None], sink: EventSink | None = None
) -> StreamDone:
    """Run one `Provider.stream` to its `StreamDone`, each event to `sink`. A cancel
    closes the stream, and with it the HTTP response, at once."""
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            if sink is not None:
                sink(event)
            if isinstance(event, StreamDone):
                return event
    raise AssertionError("provider stream ended without StreamDone")  # pragma: no cover
