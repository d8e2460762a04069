"""The one internal message model every provider translates to and from.

Messages are frozen: a message's token count is computed once and cached on it,
so the pre-flight context check costs O(new messages), not O(history).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, PrivateAttr

Role = Literal["system", "user", "assistant", "tool"]


TURN_MARK = "\n\n[This turn]\n"
"""Separates the system message's stable part from what changes per turn (the date, the
journal digest, the goal): that comes last, after the cached prefix (docs/cost.md)."""


class ToolCall(BaseModel):
    """One tool call requested by the model; `arguments` is the raw JSON text it sent."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises `json.JSONDecodeError` if malformed)."""
        return json.loads(self.arguments or "{}")


class Message(BaseModel):
    """A chat message.

    Assistant messages may carry `tool_calls` and reasoning; provider-specific
    reasoning blocks (Anthropic thinking with signatures) are kept verbatim in
    `reasoning_blocks` so they can be sent back unchanged. Tool messages carry
    `tool_call_id`, the tool's `name` and `is_error`.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    reasoning_blocks: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    artifacts: tuple[str, ...] = ()  # tool results: files holding the full, uncut output
    # assistant messages made under provider failover: the provider that made it, whose
    # reasoning blocks only it may be sent back (docs/providers.md#failover); "" unknown
    origin: str = ""

    # Caches of what is derived from the (frozen) fields: the token count, the JSON per
    # wire format (`core.providers.jsonbody`). `model_copy(update=…)` drops them.
    _tokens: int | None = PrivateAttr(default=None)
    _json: dict[str, str] | None = PrivateAttr(default=None)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with `update`, the caches derived from the old fields are dropped."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._tokens = None
            copy._json = None
        return copy

    @classmethod
    def system(cls, text: str) -> Message:
        return cls(role="system", content=text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", content=text)

    @classmethod
    def assistant(cls, text: str, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return cls(role="assistant", content=text, tool_calls=tool_calls)

    @classmethod
    def tool_result(
        cls,
        call: ToolCall,
        text: str,
        *,
        is_error: bool = False,
        artifacts: tuple[str, ...] = (),
    ) -> Message:
        return cls(
            role="tool",
            content=text,
            tool_call_id=call.id,
            name=call.name,
            is_error=is_error,
            artifacts=artifacts,
        )


CANCELLED_RESULT = "operation cancelled by user"
