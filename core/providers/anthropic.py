"""Anthropic Messages API (`/v1/messages`); thinking blocks are kept and sent back verbatim."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.events import ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta, Usage
from core.messages import Message
from core.providers.base import MessageBuilder, Provider, decode_json, error_from_event
from core.tools.base import ToolSpec

ANTHROPIC_VERSION = "2023-06-01"


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}  # the model sent broken JSON; its error result already says so
    return value if isinstance(value, dict) else {}


def anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """Our history as (system, messages); tool results become `tool_result` blocks in a
    user turn, and consecutive same-role turns are merged as the API requires."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            system.append(m.content)
            continue
        blocks: list[dict[str, Any]]
        if m.role == "tool":
            role = "user"
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id,
                "content": m.content or "(no output)",
            }
            if m.is_error:
                result["is_error"] = True
            blocks = [result]
        elif m.role == "assistant":
            role = "assistant"
            blocks = [dict(b) for b in m.reasoning_blocks]
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks.extend(
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)}
                for c in m.tool_calls
            )
            if not blocks:
                blocks = [{"type": "text", "text": "(empty)"}]
        else:
            role = "user"
            blocks = [{"type": "text", "text": m.content or "(empty)"}]
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


class AnthropicProvider(Provider):
    path = "/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self.settings.api_key:
            headers["x-api-key"] = self.settings.api_key
        return headers

    def build_body(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        system, wire = anthropic_messages(messages)
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": wire,
            "max_tokens": self.settings.max_output_tokens,
            "stream": True,
        }
        if system:
            body["system"] = system
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in tools
            ]
        return body

    def parse(self, event: str, data: str, acc: MessageBuilder) -> list[StreamEvent]:
        payload = decode_json(data, self.name)
        kind = payload.get("type") or event
        match kind:
            case "content_block_start":
                return self._block_start(payload, acc)
            case "content_block_delta":
                return self._block_delta(payload, acc)
            case "message_start":
                usage = (payload.get("message") or {}).get("usage") or {}
                acc.usage = Usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0))
            case "message_delta":
                acc.stop_reason = (payload.get("delta") or {}).get("stop_reason") or ""
                out_tokens = (payload.get("usage") or {}).get("output_tokens", 0)
                input_tokens = acc.usage.input_tokens if acc.usage else 0
                return [Usage(input_tokens, out_tokens)]
            case "message_stop":
                acc.finished = True
            case "error":
                raise error_from_event(self.name, payload.get("error") or payload)
        return []

    @staticmethod
    def _block_start(payload: dict[str, Any], acc: MessageBuilder) -> list[StreamEvent]:
        block = payload.get("content_block") or {}
        index = int(payload.get("index", 0))
        match block.get("type"):
            case "tool_use":
                acc.index_map[index] = slot = len(acc.index_map)
                return [ToolCallDelta(slot, block.get("id"), block.get("name"), "")]
            case "thinking" | "redacted_thinking":
                acc.reasoning_blocks.append(dict(block))
                acc.reasoning_index[index] = len(acc.reasoning_blocks) - 1
                if text := block.get("thinking"):
                    return [ReasoningDelta(text)]
            case "text" if block.get("text"):
                return [TextDelta(block["text"])]
        return []

    @staticmethod
    def _block_delta(payload: dict[str, Any], acc: MessageBuilder) -> list[StreamEvent]:
        delta = payload.get("delta") or {}
        index = int(payload.get("index", 0))
        match delta.get("type"):
            case "text_delta":
                return [TextDelta(delta.get("text", ""))]
            case "input_json_delta":
                # Only our own tool_use blocks are tracked: server tools (`server_tool_use`,
                # web search) and block types we do not know stream input we must not run.
                slot = acc.index_map.get(index)
                if slot is None:
                    return []
                return [ToolCallDelta(slot, None, None, delta.get("partial_json", ""))]
            case "thinking_delta" | "signature_delta":
                position = acc.reasoning_index.get(index)
                if position is None:
                    return []
                # Keep the block verbatim (with its signature) so it can be sent back.
                block = acc.reasoning_blocks[position]
                field_name = "thinking" if delta["type"] == "thinking_delta" else "signature"
                block[field_name] = block.get(field_name, "") + delta.get(field_name, "")
                if field_name == "thinking":
                    return [ReasoningDelta(delta.get("thinking", ""))]
        return []
