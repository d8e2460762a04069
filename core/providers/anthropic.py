"""Anthropic Messages API (`/v1/messages`); thinking blocks are kept and sent back verbatim."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.events import ReasoningDelta, TextDelta
from core.messages import Message
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
        blocks = message_json("anthropic", m, anthropic_blocks)
        if turns and turns[-1][0] == role:
            turns[-1][1].append(blocks)
        else:
            turns.append((role, [blocks]))
    wire = RawList(
        Raw(f'{{"role":"{role}","content":[{",".join(blocks)}]}}') for role, blocks in turns
    )
    return "\n\n".join(system), wire


def anthropic_tool(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


_tools_json = ToolListCache(anthropic_tool)


def build_body(
    messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ProviderSettings
) -> dict[str, Any]:
    system, wire = anthropic_messages(messages)
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": wire,
        "max_tokens": settings.max_output_tokens,
        "stream": True,
    }
    if system:
        body["system"] = system
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = _tools_json(tools)
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
            return [InputUsage(usage.get("input_tokens", 0), usage.get("output_tokens", 0))]
        case "message_delta":
            reason = (payload.get("delta") or {}).get("stop_reason") or ""
            output_tokens = (payload.get("usage") or {}).get("output_tokens", 0)
            return [StopReason(reason), OutputUsage(output_tokens)]
        case "message_stop":
            return [TurnEnd()]
        case "error":
            return [WireError(error_object(payload.get("error") or payload))]
    return []


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
