"""OpenAI Responses API (`/responses`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from core.events import ReasoningDelta, TextDelta, Usage
from core.messages import Message
from core.providers.base import ProviderSettings, bearer_headers
from core.providers.jsonbody import RawList, ToolListCache, message_json
from core.providers.wire import (
    Malformed,
    Refusal,
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

FAILURES = frozenset({"response.failed", "response.incomplete", "error"})


def responses_items(m: Message) -> list[dict[str, Any]]:
    """The `input` items of one non-system message (an assistant's text and each call)."""
    match m.role:
        case "tool":
            return [
                {"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}
            ]
        case "assistant":
            items: list[dict[str, Any]] = []
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            items.extend(
                {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                for c in m.tool_calls
            )
            return items
        case _:
            return [{"role": "user", "content": m.content}]


def responses_input(messages: Sequence[Message]) -> tuple[str, RawList]:
    """Split our history into `instructions` (system text) and `input` items."""
    instructions = [m.content for m in messages if m.role == "system"]
    items = RawList(
        message_json("responses", m, responses_items) for m in messages if m.role != "system"
    )
    return "\n\n".join(instructions), items


def responses_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    }


_tools_json = ToolListCache(responses_tool)


def build_body(
    messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ProviderSettings
) -> dict[str, Any]:
    instructions, items = responses_input(messages)
    # What stays the same from call to call first, the growing history last (docs/cost.md).
    body: dict[str, Any] = {
        "model": settings.model,
        "stream": True,
        "store": False,
        "max_output_tokens": settings.max_output_tokens,
    }
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if tools:
        body["tools"] = _tools_json(tools)
    if instructions:
        body["instructions"] = instructions
    body["input"] = items
    return body


def parse(event: str, data: str) -> list[WireEvent]:
    """One Responses stream event. Output items are numbered by `output_index`; the
    builder numbers the tool calls among them 0, 1, 2 …"""
    payload = json_object(data)
    if isinstance(payload, Malformed):
        return [payload]
    kind = payload.get("type") or event
    if kind == "response.output_text.delta":
        return [TextDelta(payload.get("delta", ""))]
    if kind == "response.refusal.delta":
        return [Refusal(payload.get("delta", ""))]
    if kind.startswith("response.reasoning") and kind.endswith(".delta"):
        return [ReasoningDelta(payload.get("delta", ""))]
    if kind == "response.output_item.added":
        item = payload.get("item") or {}
        if item.get("type") == "function_call":
            start = ToolCallStart(
                _item(payload), item.get("call_id"), item.get("name"), item.get("arguments") or ""
            )
            return [start, StopReason("tool_calls")]
    elif kind == "response.function_call_arguments.delta":
        # An item never announced still gets a call of its own, as it always has.
        arguments = ToolCallArguments(_item(payload), payload.get("delta", ""), new_if_unknown=True)
        return [arguments, StopReason("tool_calls")]
    elif kind == "response.completed":
        response = payload.get("response") or {}
        usage = response.get("usage")
        if usage:
            cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
            given = Usage(usage.get("input_tokens") or 0, usage.get("output_tokens") or 0)
            return [replace(given, cached_tokens=cached), TurnEnd()]
        return [TurnEnd()]
    elif kind in FAILURES:
        return [_failure(payload)]
    return []


def _item(payload: dict[str, Any]) -> int:
    return int(payload.get("output_index", 0))


def _failure(payload: dict[str, Any]) -> WireError:
    """`error` ({type: "error", code, message} at the top level), `response.failed`
    (`response.error`) or `response.incomplete` (`response.incomplete_details`)."""
    response = payload.get("response") or {}
    error = (
        response.get("error")
        or response.get("incomplete_details")
        or payload.get("error")
        or {k: v for k, v in payload.items() if k not in ("type", "sequence_number")}
    )
    return WireError(error_object(error))


class OpenAIResponses:
    """The Responses wire format (`WireFormat`)."""

    cache_key = True  # takes `prompt_cache_key` (docs/cost.md#prompt-caching)
    path = "/responses"

    @staticmethod
    def headers(api_key: str | None) -> dict[str, str]:
        return bearer_headers(api_key)

    build_body = staticmethod(build_body)
    parse = staticmethod(parse)


OPENAI_RESPONSES = OpenAIResponses()
