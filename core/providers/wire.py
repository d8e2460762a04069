"""Wire events: what a wire format's pure `parse` emits for one server-sent event.

A parser knows one event at a time and nothing of what came before, so what needs the
stream so far (which call slot an item is, the input tokens of Anthropic's first event,
whether a reasoning block was announced) is said with the events below and resolved by
the one `ResponseBuilder`. The public stream events of `core.events` (`TextDelta`,
`ReasoningDelta`, `ToolCallDelta`, `Usage`) are wire events too: they pass through as
they are.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from core.events import ReasoningDelta, TextDelta, ToolCallDelta, Usage
from core.records import record

REASONING_MARKERS = ("reasoning", "thinking", "thought")


@record(frozen=True, slots=True)
class UnindexedToolCall:
    """A Chat Completions tool-call fragment without an `index` (some servers): it belongs
    to the call with its id, else starts a new call if it has an id, else continues the
    last call."""

    id: str | None
    name: str | None
    arguments: str
    kind: Literal["unindexed_tool_call"] = "unindexed_tool_call"


@record(frozen=True, slots=True)
class ToolCallStart:
    """Output item `item` (Responses' output index, Anthropic's content-block index) is a
    tool call: it takes the next call slot."""

    item: int
    id: str | None
    name: str | None
    arguments: str = ""
    kind: Literal["tool_call_start"] = "tool_call_start"


@record(frozen=True, slots=True)
class ToolCallArguments:
    """More arguments of the tool call at output item `item`. Arguments of an item never
    started are dropped (Anthropic's server tools stream input we must not run), unless
    `new_if_unknown`: then they start a call of their own."""

    item: int
    arguments: str
    new_if_unknown: bool = False
    kind: Literal["tool_call_arguments"] = "tool_call_arguments"


@record(frozen=True, slots=True)
class ReasoningBlockStart:
    """A reasoning block at content index `item` that is kept verbatim (with its
    signature) and sent back with the assistant message (Anthropic thinking)."""

    item: int
    block: dict[str, Any]
    kind: Literal["reasoning_block_start"] = "reasoning_block_start"


@record(frozen=True, slots=True)
class ReasoningBlockDelta:
    """Text for `field` of the kept reasoning block at `item`; `thinking` text is also
    shown as reasoning. Deltas of a block never started are dropped."""

    item: int
    field: Literal["thinking", "signature"]
    text: str
    kind: Literal["reasoning_block_delta"] = "reasoning_block_delta"


@record(frozen=True, slots=True)
class Refusal:
    """Refusal text: shown and kept as the answer; the stop reason becomes "refusal"."""

    text: str
    kind: Literal["refusal"] = "refusal"


@record(frozen=True, slots=True)
class StopReason:
    """Why the model stopped, as the server says it ("" clears it)."""

    reason: str
    kind: Literal["stop_reason"] = "stop_reason"


@record(frozen=True, slots=True)
class InputUsage:
    """Usage known at the start of the turn (Anthropic `message_start`): recorded, not shown.
    `input_tokens` is the whole prompt (Anthropic's uncached input plus its cache reads and
    writes)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    kind: Literal["input_usage"] = "input_usage"


@record(frozen=True, slots=True)
class OutputUsage:
    """Output tokens so far (Anthropic `message_delta`); the input tokens are those of the
    `InputUsage` before it. Shown as a `Usage`."""

    output_tokens: int
    input: InputUsage | None = None  # the input usage again, when the event repeats it
    kind: Literal["output_usage"] = "output_usage"


@record(frozen=True, slots=True)
class TurnEnd:
    """The turn is complete; what follows on the wire is read but not parsed."""

    kind: Literal["turn_end"] = "turn_end"


@record(frozen=True, slots=True)
class WireError:
    """The server reported an error inside the stream; `error` is its error object
    (`{"message", "type", "code", ...}`), mapped to our tree by the provider."""

    error: dict[str, Any]
    kind: Literal["wire_error"] = "wire_error"


@record(frozen=True, slots=True)
class Malformed:
    """An event whose data is not the JSON object it should be."""

    data: str
    kind: Literal["malformed"] = "malformed"


WireEvent = (
    TextDelta
    | ReasoningDelta
    | ToolCallDelta
    | Usage
    | UnindexedToolCall
    | ToolCallStart
    | ToolCallArguments
    | ReasoningBlockStart
    | ReasoningBlockDelta
    | Refusal
    | StopReason
    | InputUsage
    | OutputUsage
    | TurnEnd
    | WireError
    | Malformed
)


def json_object(data: str) -> dict[str, Any] | Malformed:
    """The JSON object in an event's data, or `Malformed`."""
    try:
        value = json.loads(data)
    except ValueError:
        return Malformed(data)
    return value if isinstance(value, dict) else Malformed(data)


def error_object(error: Any) -> dict[str, Any]:
    """A vendor's error as an error object (some send only text)."""
    return error if isinstance(error, dict) else {"message": str(error)}


def is_reasoning_key(key: str) -> bool:
    """Whether a delta field carries reasoning (`reasoning_content`, `thinking`, …)."""
    lowered = key.lower()
    return any(marker in lowered for marker in REASONING_MARKERS)
