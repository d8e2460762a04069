"""Anthropic Messages API (`/v1/messages`); thinking blocks are kept and sent back verbatim.

Prompt caching (docs/cost.md#prompt-caching): `cache_control` breakpoints on the last tool,
the stable part of the system message and the last two messages — four, the API's most.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.events import ReasoningDelta, TextDelta
from core.messages import TURN_MARK, Message
from core.providers.base import ProviderSettings
from core.providers.jsonbody import Raw, RawList, ToolListCache, message_json
from core.providers.wire import (
    InputUsage,
    Malformed,
    OutputUsage,
    ReasoningBlockDelta,
    ReasoningBlockStart,
    StopReason,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
    WireError,
    WireEvent,
    error_object,
    json_object,
)
from core.tools.base import ToolSpec

ANTHROPIC_VERSION = "2023-06-01"


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}  # the model sent broken JSON; its error result already says so
    return value if isinstance(value, dict) else {}


def anthropic_blocks(m: Message) -> list[dict[str, Any]]:
    """The content blocks of one non-system message: tool results are `tool_result`
    blocks (of a user turn)."""
    if m.role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": m.tool_call_id,
            "content": m.content or "(no output)",
        }
        if m.is_error:
            result["is_error"] = True
        return [result]
    if m.role == "assistant":
        blocks = [dict(b) for b in m.reasoning_blocks]
        if m.content:
            blocks.append({"type": "text", "text": m.content})
        blocks.extend(
            {"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)}
            for c in m.tool_calls
        )
        return blocks or [{"type": "text", "text": "(empty)"}]
    return [{"type": "text", "text": m.content or "(empty)"}]


def anthropic_messages(messages: Sequence[Message]) -> tuple[str, RawList]:
    """Our history as (system, messages); consecutive same-role turns (a tool result is
    the user's) are merged into one, as the API requires."""
    system: list[str] = []
    turns: list[tuple[str, list[str]]] = []
    for m in messages:
        if m.role == "system":
            system.append(m.content)
            continue
        role = "assistant" if m.role == "assistant" else "user"
        encoded = message_json("anthropic", m, anthropic_blocks)
        if turns and turns[-1][0] == role:
            turns[-1][1].append(encoded)
        else:
            turns.append((role, [encoded]))
    for _role, parts in turns[-CACHED_TURNS:]:
        parts[-1] = _marked(parts[-1])
    wire = RawList(
        Raw(f'{{"role":"{role}","content":[{",".join(blocks)}]}}') for role, blocks in turns
    )
    return "\n\n".join(system), wire


CACHE_MARK = ',"cache_control":{"type":"ephemeral"}}'
CACHED_TURNS = 2  # breakpoints on the last two messages; with tools and system, four


def _marked(blocks: str) -> str:
    """`blocks` (JSON objects joined by commas) with a cache breakpoint on the last one;
    a thinking block takes none, so that turn goes unmarked."""
    last = blocks.rfind('{"type":')
    if blocks[last:].startswith(('{"type":"thinking"', '{"type":"redacted_thinking"')):
        return blocks
    return blocks[:-1] + CACHE_MARK


def system_blocks(system: str) -> list[dict[str, Any]]:
    """The system text as blocks: the stable part with a cache breakpoint, then what
    changes from turn to turn (after `TURN_MARK`) without one."""
    stable, mark, volatile = system.partition(TURN_MARK)
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": stable, "cache_control": {"type": "ephemeral"}}
    ]
    if mark and volatile:
        blocks.append({"type": "text", "text": volatile})
    return blocks


def anthropic_tool(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


_plain_tools_json = ToolListCache(anthropic_tool)


def _tools_json(tools: Sequence[ToolSpec]) -> Raw:
    """The tool list with a cache breakpoint on its last tool (it caches them all)."""
    return Raw(_plain_tools_json(tools)[:-2] + CACHE_MARK + "]")


def build_body(
    messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ProviderSettings
) -> dict[str, Any]:
    system, wire = anthropic_messages(messages)
    # What stays the same from call to call first, the growing history last: a request
    # repeats the previous one's bytes up to its newest messages (docs/cost.md).
    body: dict[str, Any] = {
        "model": settings.model,
        "max_tokens": settings.max_output_tokens,
        "stream": True,
    }
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = _tools_json(tools)
    if system:
        body["system"] = system_blocks(system)
    body["messages"] = wire
    return body


def headers(api_key: str | None) -> dict[str, str]:
    result = {"anthropic-version": ANTHROPIC_VERSION}
    if api_key:
        result["x-api-key"] = api_key
    return result


def parse(event: str, data: str) -> list[WireEvent]:
    """One Messages stream event. Content blocks are numbered by `index`; the builder
    numbers the tool calls among them 0, 1, 2 … and keeps the thinking blocks."""
    payload = json_object(data)
    if isinstance(payload, Malformed):
        return [payload]
    match payload.get("type") or event:
        case "content_block_start":
            return _block_start(payload)
        case "content_block_delta":
            return _block_delta(payload)
        case "message_start":
            usage = (payload.get("message") or {}).get("usage") or {}
            return [input_usage(usage)]
        case "message_delta":
            reason = (payload.get("delta") or {}).get("stop_reason") or ""
            usage = payload.get("usage") or {}
            # Newer servers repeat the input usage here, cumulatively: it wins.
            again = input_usage(usage) if "input_tokens" in usage else None
            return [StopReason(reason), OutputUsage(usage.get("output_tokens", 0) or 0, again)]
        case "message_stop":
            return [TurnEnd()]
        case "error":
            return [WireError(error_object(payload.get("error") or payload))]
    return []


def input_usage(usage: dict[str, Any]) -> InputUsage:
    """Anthropic's `input_tokens` leave out the cache reads and writes: the whole prompt is
    the three together (docs/cost.md#prompt-caching)."""
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    uncached = int(usage.get("input_tokens") or 0)
    output = int(usage.get("output_tokens") or 0)
    return InputUsage(uncached + read + written, output, read, written)


def _block_start(payload: dict[str, Any]) -> list[WireEvent]:
    block = payload.get("content_block") or {}
    index = int(payload.get("index", 0))
    match block.get("type"):
        case "tool_use":
            return [ToolCallStart(index, block.get("id"), block.get("name"))]
        case "thinking" | "redacted_thinking":
            start = ReasoningBlockStart(index, block)
            if text := block.get("thinking"):
                return [start, ReasoningDelta(text)]
            return [start]
        case "text" if block.get("text"):
            return [TextDelta(block["text"])]
    return []


def _block_delta(payload: dict[str, Any]) -> list[WireEvent]:
    delta = payload.get("delta") or {}
    index = int(payload.get("index", 0))
    match delta.get("type"):
        case "text_delta":
            return [TextDelta(delta.get("text", ""))]
        case "input_json_delta":
            # Only our own tool_use blocks get a call: server tools (`server_tool_use`, web
            # search) and block types we do not know stream input we must not run.
            return [ToolCallArguments(index, delta.get("partial_json", ""))]
        case "thinking_delta":
            return [ReasoningBlockDelta(index, "thinking", delta.get("thinking", ""))]
        case "signature_delta":
            return [ReasoningBlockDelta(index, "signature", delta.get("signature", ""))]
    return []


class Anthropic:
    """The Anthropic Messages wire format (`WireFormat`)."""

    path = "/v1/messages"
    headers = staticmethod(headers)
    build_body = staticmethod(build_body)
    parse = staticmethod(parse)


ANTHROPIC = Anthropic()
