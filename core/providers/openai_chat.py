"""OpenAI-compatible Chat Completions (`/chat/completions`): OpenAI, OpenRouter, Ollama,
vLLM, llama.cpp, LM Studio, Groq, DeepSeek."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.events import ReasoningDelta, TextDelta, ToolCallDelta, Usage
from core.messages import Message
from core.providers.base import ProviderSettings, bearer_headers
from core.providers.jsonbody import RawList, ToolListCache, message_json
from core.providers.wire import (
    Malformed,
    Refusal,
    StopReason,
    TurnEnd,
    UnindexedToolCall,
    WireError,
    WireEvent,
    error_object,
    is_reasoning_key,
    json_object,
)
from core.tools.base import ToolSpec


def chat_message(message: Message) -> dict[str, Any]:
    match message.role:
        case "tool":
            return {
                "role": "tool",
                "tool_call_id": message.tool_call_id,
                "content": message.content,
            }
        case "assistant" if message.tool_calls:
            return {
                "role": "assistant",
                "content": message.content or None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ],
            }
        case _:
            return {"role": message.role, "content": message.content}


def chat_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


_tools_json = ToolListCache(chat_tool)


def build_body(
    messages: Sequence[Message], tools: Sequence[ToolSpec], settings: ProviderSettings
) -> dict[str, Any]:
    # What stays the same from call to call first, the growing history last (docs/cost.md).
    body: dict[str, Any] = {
        "model": settings.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": settings.max_output_tokens,
    }
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if tools:  # some servers reject an empty list
        body["tools"] = _tools_json(tools)
    body["messages"] = RawList(message_json("chat", m, chat_message) for m in messages)
    return body


def parse(event: str, data: str) -> list[WireEvent]:
    """One Chat Completions chunk (or `[DONE]`, or an `event: error`)."""
    if data.strip() == "[DONE]":
        return [TurnEnd()]
    if event == "error":
        return [_stream_error(data)]
    chunk = json_object(data)
    if isinstance(chunk, Malformed):
        return [chunk]
    if chunk.get("error"):
        # Groq, OpenRouter, vLLM: the server's error as a chunk of its own. Dropping it
        # would leave a cut stream, retried in vain, with the reason never shown.
        return [WireError(error_object(chunk["error"]))]
    out: list[WireEvent] = []
    if usage := chunk.get("usage"):
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        out.append(Usage(prompt, completion, cached_tokens=cached))
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        for key, value in delta.items():
            if value and isinstance(value, str) and is_reasoning_key(key):
                out.append(ReasoningDelta(value))
        if text := delta.get("content"):
            out.append(TextDelta(text))
        if refusal := delta.get("refusal"):
            out.append(Refusal(refusal))  # the refusal is the answer the user gets to read
        for fragment in delta.get("tool_calls") or ():
            out.append(_tool_fragment(fragment))
        if reason := choice.get("finish_reason"):
            out.append(StopReason(reason))
    return out


def _stream_error(data: str) -> WireError:
    """An `event: error`: its data is `{"error": {...}}`, a bare error object or text."""
    try:
        payload = json.loads(data)
    except ValueError:
        payload = data.strip() or "(no details)"
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict | str):
        payload = payload["error"]
    return WireError(error_object(payload))


def _tool_fragment(fragment: dict[str, Any]) -> ToolCallDelta | UnindexedToolCall:
    function = fragment.get("function") or {}
    call_id, name = fragment.get("id"), function.get("name")
    arguments = function.get("arguments") or ""
    index = fragment.get("index")
    if index is None:  # some servers omit the index: the builder matches it to a call
        return UnindexedToolCall(call_id, name, arguments)
    return ToolCallDelta(int(index), call_id, name, arguments)


class OpenAIChat:
    """The Chat Completions wire format (`WireFormat`)."""

    cache_key = True  # takes `prompt_cache_key` (docs/cost.md#prompt-caching)
    path = "/chat/completions"

    @staticmethod
    def headers(api_key: str | None) -> dict[str, str]:
        return bearer_headers(api_key)

    build_body = staticmethod(build_body)
    parse = staticmethod(parse)


OPENAI_CHAT = OpenAIChat()
