"""An in-process `Provider` that plays a script: for agent-level tests, no HTTP.

Wire formats keep their own tests against the HTTP fake (`tests/fakes/llm.py`); tests of
the loop, the agent or a channel that only need "the model answers this" use this::

    provider = ScriptedProvider([
        ScriptedReply("Let me look.", tool_calls=[tool_call("lookup", {"key": "a"})]),
        ProviderRateLimited("HTTP 429: slow down", status=429),
    ])
    ...
    assert provider.requests[1].messages[-1].role == "tool"
    provider.assert_complete()

Replies are streamed as a real provider streams them (text in chunks, then tool calls,
then usage) and assembled by the same `ResponseBuilder`. An exception in the script is
raised by the call that reaches it, as a real provider raises it after its retries; give
`max_retries` to have retryable ones retried (with `StreamRestarted`) on `clock` instead.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any

from core.clock import Clock
from core.events import (
    EventSink,
    ReasoningDelta,
    StreamDone,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from core.messages import Message, ToolCall
from core.providers.base import Provider, ProviderSettings, complete
from core.providers.builder import ResponseBuilder
from core.providers.transport import retrying
from core.providers.wire import StopReason, TurnEnd, WireEvent
from core.records import record
from core.tools.base import ToolSpec

_call_ids = itertools.count(1)


def tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str = ""
) -> ToolCall:
    """A tool call for a script; `arguments` as a dict or raw JSON text, `id` made up if
    not given (unique in the process, as the loop needs them to be)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or f"scripted_{next(_call_ids)}", name=name, arguments=text)


@record(frozen=True, slots=True)
class ScriptedReply:
    """One scripted assistant turn.

    Args:
        text: the answer; a string is streamed in chunks of `chunk_size` characters, a
            sequence of strings chunk by chunk as given.
        tool_calls: calls the model makes (see `tool_call`).
        reasoning: streamed as reasoning before the text.
        usage: the usage the provider reports; None: none (the loop then estimates).
        stop_reason: default "tool_calls" when there are calls, else "stop".
    """

    text: str | Sequence[str] = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str = ""
    usage: Usage | None = None
    stop_reason: str | None = None
    chunk_size: int = 8

    def chunks(self) -> list[str]:
        if not isinstance(self.text, str):
            return list(self.text)
        size = max(1, self.chunk_size)
        return [self.text[i : i + size] for i in range(0, len(self.text), size)]

    def events(self) -> Iterable[WireEvent]:
        """What a provider streams for this turn, as wire events for the builder."""
        if self.reasoning:
            yield ReasoningDelta(self.reasoning)
        yield from (TextDelta(chunk) for chunk in self.chunks())
        for index, call in enumerate(self.tool_calls):
            yield ToolCallDelta(index, call.id, call.name, call.arguments)
        if self.usage is not None:
            yield self.usage
        yield StopReason(self.stop_reason or ("tool_calls" if self.tool_calls else "stop"))
        yield TurnEnd()


ScriptStep = ScriptedReply | BaseException


@record(frozen=True, slots=True)
class ScriptedRequest:
    """What one call received: the messages as they were then, and the tools offered."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]


@record(slots=True)
class ScriptedProvider:
    """A `Provider` answering each call with the next step of `script`.

    Attributes:
        requests: every call received, in order.
    """

    script: list[ScriptStep]
    settings: ProviderSettings = field(
        default_factory=lambda: ProviderSettings("scripted", "scripted", "", "scripted-model")
    )
    max_retries: int = 0
    clock: Clock = field(default_factory=lambda: _Instant())
    requests: list[ScriptedRequest] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        self.script = list(self.script)  # played from our own copy, never the caller's

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def remaining(self) -> int:
        """Steps of the script not yet played."""
        return len(self.script)

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream the next scripted turn (a retried error plays the step after it)."""
        return retrying(lambda: self._attempt(messages, tools), self.max_retries, self.clock)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        sink: EventSink | None = None,
    ) -> StreamDone:
        return await complete(self.stream(messages, tools), sink)

    async def aclose(self) -> None:
        self.closed = True

    def assert_complete(self) -> None:
        """Raise `AssertionError` if steps of the script were never played."""
        if self.script:
            raise AssertionError(
                f"{len(self.script)} scripted step(s) never played "
                f"(after {len(self.requests)} request(s)): {self.script!r}"
            )

    async def _attempt(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> AsyncGenerator[StreamEvent, None]:
        self.requests.append(ScriptedRequest(tuple(messages), tuple(tools)))
        if not self.script:
            raise AssertionError(
                f"ScriptedProvider: request {len(self.requests)} came; the script is played out"
            )
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        acc = ResponseBuilder()
        for wire_event in step.events():
            if (event := acc.add(wire_event)) is not None:
                yield event
        yield acc.done()


if TYPE_CHECKING:
    _is_a_provider: Provider = ScriptedProvider([])  # mypy checks the protocol here


class _Instant:
    """The scripted provider's clock: a retry of a scripted error waits for nothing."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
