"""OpenAI-compatible Chat Completions (`/chat/completions`): OpenAI, OpenRouter, Ollama,
vLLM, llama.cpp, LM Studio, Groq, DeepSeek."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.errors import ProviderError
from core.events import ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta, Usage
from core.messages import Message
from core.providers.base import (
    MessageBuilder,
    Provider,
    decode_json,
    error_from_event,
    is_reasoning_key,
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


class OpenAIChatProvider(Provider):
    path = "/chat/completions"

    def build_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [chat_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.settings.max_output_tokens,
        }
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if tools:  # some servers reject an empty list
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        return body

    def parse(self, event: str, data: str, acc: MessageBuilder) -> list[StreamEvent]:
        if data.strip() == "[DONE]":
            acc.finished = True
            return []
        if event == "error":
            raise self._stream_error(data)
        chunk = decode_json(data, self.name)
        if isinstance(chunk, dict) and chunk.get("error"):
            # Groq, OpenRouter, vLLM: the server's error as a chunk of its own. Dropping it
            # would leave a cut stream, retried in vain, with the reason never shown.
            raise error_from_event(self.name, chunk["error"])
        out: list[StreamEvent] = []
        if usage := chunk.get("usage"):
            out.append(Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)))
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            for key, value in delta.items():
                if value and isinstance(value, str) and is_reasoning_key(key):
                    out.append(ReasoningDelta(value))
            if text := delta.get("content"):
                out.append(TextDelta(text))
            if refusal := delta.get("refusal"):
                acc.refused = True  # the refusal is the answer the user gets to read
                out.append(TextDelta(refusal))
            for fragment in delta.get("tool_calls") or ():
                out.append(self._tool_fragment(fragment, acc))
            if reason := choice.get("finish_reason"):
                acc.stop_reason = reason
        return out

    def _stream_error(self, data: str) -> ProviderError:
        """An `event: error`: its data is `{"error": {...}}`, a bare error object or text."""
        try:
            payload = json.loads(data)
        except ValueError:
            payload = data.strip() or "(no details)"
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict | str):
            payload = payload["error"]
        return error_from_event(self.name, payload)

    @staticmethod
    def _tool_fragment(fragment: dict[str, Any], acc: MessageBuilder) -> ToolCallDelta:
        function = fragment.get("function") or {}
        index = fragment.get("index")
        call_id = fragment.get("id")
        if index is None:  # some servers omit the index: match by id, else continue the last
            ids = {parts[0]: i for i, parts in acc.calls.items()}
            if call_id and call_id in ids:
                index = ids[call_id]
            elif call_id:
                index = len(acc.calls)
            else:
                index = max(acc.calls, default=0)
        return ToolCallDelta(
            int(index), call_id, function.get("name"), function.get("arguments") or ""
        )
