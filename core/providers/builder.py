"""The one assembler of a streamed assistant turn, whatever the wire format."""

from __future__ import annotations

import uuid
from dataclasses import field
from typing import Any

from core.events import ReasoningDelta, StreamDone, StreamEvent, TextDelta, ToolCallDelta, Usage
from core.messages import Message, ToolCall
from core.providers.wire import (
    InputUsage,
    Malformed,
    OutputUsage,
    ReasoningBlockDelta,
    ReasoningBlockStart,
    Refusal,
    StopReason,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
    UnindexedToolCall,
    WireError,
    WireEvent,
)
from core.records import record


@record(slots=True)
class ResponseBuilder:
    """Accumulates one streamed assistant turn from wire events.

    `add` resolves each wire event against the stream so far and returns the public event
    to show, if any: tool-call fragments are merged by call slot, refusals become the
    answer, Anthropic's thinking blocks are kept verbatim. `done` is the final
    `StreamDone`. One builder per attempt.
    """

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_blocks: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # slot -> [id, name, args...]
    call_slots: dict[int, int] = field(default_factory=dict)  # wire item -> call slot
    block_slots: dict[int, int] = field(default_factory=dict)  # wire item -> reasoning block
    stop_reason: str = ""
    refused: bool = False  # the text is the model's refusal (stop reason "refusal")
    usage: Usage | None = None
    finished: bool = False

    def add(self, event: WireEvent) -> StreamEvent | None:
        """Take one wire event; the public event it amounts to, if any.

        `WireError` and `Malformed` are the caller's to map to an error before this."""
        match event:
            case TextDelta(text=text):
                self.text.append(text)
                return event
            case ToolCallDelta():
                self._merge(event)
                return event
            case ReasoningDelta(text=text):
                self.reasoning.append(text)
                return event
            case Usage():
                self.usage = event
                return event
            case UnindexedToolCall() | ToolCallStart() | ToolCallArguments():
                return self._tool_call(event)
            case ReasoningBlockStart() | ReasoningBlockDelta():
                return self._reasoning_block(event)
            case Refusal(text=text):
                self.refused = True  # the refusal is the answer the user gets to read
                return self.add(TextDelta(text))
            case StopReason(reason=reason):
                self.stop_reason = reason
            case InputUsage():
                self.usage = _usage(event, event.output_tokens)
            case OutputUsage(output_tokens=tokens_out, input=given):
                if given is not None:
                    return self.add(_usage(given, tokens_out))
                if self.usage is None:
                    return self.add(Usage(0, tokens_out))
                usage = self.usage
                cached, written = usage.cached_tokens, usage.cache_write_tokens
                return self.add(Usage(usage.input_tokens, tokens_out, False, cached, written))
            case TurnEnd():
                self.finished = True
            case WireError() | Malformed():
                raise AssertionError(f"{event.kind} must be mapped before the builder")
        return None

    def _tool_call(
        self, event: UnindexedToolCall | ToolCallStart | ToolCallArguments
    ) -> ToolCallDelta | None:
        match event:
            case UnindexedToolCall(id=call_id, name=name, arguments=args):
                delta = ToolCallDelta(self._unindexed_slot(call_id), call_id, name, args)
            case ToolCallStart(item=item, id=call_id, name=name, arguments=args):
                self.call_slots[item] = slot = len(self.call_slots)
                delta = ToolCallDelta(slot, call_id, name, args)
            case ToolCallArguments(item=item, arguments=args):
                slot_or_none = self.call_slots.get(item)
                if slot_or_none is None:
                    if not event.new_if_unknown:
                        return None  # not a call of ours (Anthropic server tools)
                    self.call_slots[item] = slot_or_none = len(self.call_slots)
                delta = ToolCallDelta(slot_or_none, None, None, args)
        self._merge(delta)
        return delta

    def _unindexed_slot(self, call_id: str | None) -> int:
        """Match by id, else a new call if it has an id, else continue the last call."""
        if call_id:
            for slot, parts in self.calls.items():
                if parts[0] == call_id:
                    return slot
            return len(self.calls)
        return max(self.calls, default=0)

    def _merge(self, delta: ToolCallDelta) -> None:
        parts = self.calls.setdefault(delta.index, ["", ""])
        if delta.id:
            parts[0] = delta.id
        if delta.name:
            parts[1] = delta.name
        if delta.arguments:
            parts.append(delta.arguments)

    def _reasoning_block(
        self, event: ReasoningBlockStart | ReasoningBlockDelta
    ) -> ReasoningDelta | None:
        match event:
            case ReasoningBlockStart(item=item, block=block):
                self.reasoning_blocks.append(dict(block))
                self.block_slots[item] = len(self.reasoning_blocks) - 1
            case ReasoningBlockDelta(item=item, field=name, text=text):
                position = self.block_slots.get(item)
                if position is None:
                    return None
                # Kept verbatim (with its signature) so it can be sent back.
                block = self.reasoning_blocks[position]
                block[name] = block.get(name, "") + text
                if name == "thinking":
                    self.reasoning.append(text)
                    return ReasoningDelta(text)
        return None

    def has_output(self) -> bool:
        """Whether this attempt showed anything (a retry must then discard it)."""
        return bool(self.text or self.calls or self.reasoning)

    def message(self) -> Message:
        """The assistant message streamed so far."""
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

    def done(self) -> StreamDone:
        """The final event of the turn."""
        stop_reason = "refusal" if self.refused else self.stop_reason or "stop"
        return StreamDone(self.message(), stop_reason, self.usage)


def _usage(given: InputUsage, output_tokens: int) -> Usage:
    return Usage(
        given.input_tokens, output_tokens, False, given.cached_tokens, given.cache_write_tokens
    )
