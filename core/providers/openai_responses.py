"""OpenAI Responses API (`/responses`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.events import ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta, Usage
from core.messages import Message
from core.providers.base import MessageBuilder, Provider, decode_json, error_from_event
from core.tools.base import ToolSpec


def responses_input(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Split our history into `instructions` (system text) and `input` items."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for m in messages:
        match m.role:
            case "system":
                instructions.append(m.content)
            case "tool":
                items.append(
                    {"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}
                )
            case "assistant":
                if m.content:
                    items.append({"role": "assistant", "content": m.content})
                items.extend(
                    {
                        "type": "function_call",
                        "call_id": c.id,
                        "name": c.name,
                        "arguments": c.arguments,
                    }
                    for c in m.tool_calls
                )
            case _:
                items.append({"role": "user", "content": m.content})
    return "\n\n".join(instructions), items


class OpenAIResponsesProvider(Provider):
    path = "/responses"

    def build_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        instructions, items = responses_input(messages)
        body: dict[str, Any] = {
            "model": self.settings.model,
            "input": items,
            "stream": True,
            "store": False,
            "max_output_tokens": self.settings.max_output_tokens,
        }
        if instructions:
            body["instructions"] = instructions
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                }
                for t in tools
            ]
        return body

    def parse(self, event: str, data: str, acc: MessageBuilder) -> list[StreamEvent]:
        payload = decode_json(data, self.name)
        kind = payload.get("type") or event
        if kind == "response.output_text.delta":
            return [TextDelta(payload.get("delta", ""))]
        if kind == "response.refusal.delta":
            acc.refused = True  # the refusal is the answer the user gets to read
            return [TextDelta(payload.get("delta", ""))]
        if kind.startswith("response.reasoning") and kind.endswith(".delta"):
            return [ReasoningDelta(payload.get("delta", ""))]
        if kind == "response.output_item.added":
            item = payload.get("item") or {}
            if item.get("type") == "function_call":
                index = self._index(payload, acc, new=True)
                return [
                    ToolCallDelta(
                        index, item.get("call_id"), item.get("name"), item.get("arguments") or ""
                    )
                ]
        elif kind == "response.function_call_arguments.delta":
            return [ToolCallDelta(self._index(payload, acc), None, None, payload.get("delta", ""))]
        elif kind == "response.completed":
            response = payload.get("response") or {}
            acc.stop_reason = "tool_calls" if acc.calls else "stop"
            acc.finished = True
            if usage := response.get("usage"):
                return [Usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0))]
        elif kind in ("response.failed", "response.incomplete", "error"):
            return self._failure(payload)
        return []

    @staticmethod
    def _index(payload: dict[str, Any], acc: MessageBuilder, *, new: bool = False) -> int:
        # Responses numbers every output item; we number tool calls 0, 1, 2 …
        slots = acc.index_map
        output_index = int(payload.get("output_index", 0))
        if new or output_index not in slots:
            slots[output_index] = len(slots)
        return slots[output_index]

    def _failure(self, payload: dict[str, Any]) -> list[StreamEvent]:
        """`error` ({type: "error", code, message} at the top level), `response.failed`
        (`response.error`) or `response.incomplete` (`response.incomplete_details`)."""
        response = payload.get("response") or {}
        error = (
            response.get("error")
            or response.get("incomplete_details")
            or payload.get("error")
            or {k: v for k, v in payload.items() if k not in ("type", "sequence_number")}
        )
        raise error_from_event(self.name, error)
