"""The one internal message model every provider translates to and from.

Messages are frozen: a message's token count is computed once and cached on it,
so the pre-flight context check costs O(new messages), not O(history).

They are slotted dataclasses, not pydantic models: a conversation holds dozens of them
and every turn makes more, and a slotted instance is about a tenth of a model's memory
and is built without validation; the class costs no schema at import
(docs/benchmarks.md). Every constructor in Parley passes the right types; what comes
from outside (the store's JSON) goes through `from_json`, which converts and checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import field, replace
from typing import Any, Literal, cast, get_args

from core.records import record

Role = Literal["system", "user", "assistant", "tool"]
ROLES = frozenset(get_args(Role))


TURN_MARK = "\n\n[This turn]\n"
"""Separates the system message's stable part from what changes per turn (the date, the
journal digest, the goal): that comes last, after the cached prefix (docs/cost.md)."""


@record(frozen=True, slots=True)
class ToolCall:
    """One tool call requested by the model; `arguments` is the raw JSON text it sent."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises `json.JSONDecodeError` if malformed)."""
        return json.loads(self.arguments or "{}")


@record(frozen=True, slots=True)
class Message:
    """A chat message.

    Assistant messages may carry `tool_calls` and reasoning; provider-specific
    reasoning blocks (Anthropic thinking with signatures) are kept verbatim in
    `reasoning_blocks` so they can be sent back unchanged. Tool messages carry
    `tool_call_id`, the tool's `name` and `is_error`.
    """

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

    # Caches of what is derived from the (frozen) fields: the token count
    # (`core.context.tokens`), the JSON per wire format (`core.providers.jsonbody`). Set
    # with `object.__setattr__`; `with_changes` starts a message without them.
    _tokens: int | None = field(default=None, init=False, repr=False, compare=False)
    _json: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    def with_changes(self, **changes: Any) -> Message:
        """A copy with `changes`; the caches derived from the old fields are dropped."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON types (what the store keeps)."""
        return {
            "role": self.role,
            "content": self.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ],
            "reasoning": self.reasoning,
            "reasoning_blocks": list(self.reasoning_blocks),
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "is_error": self.is_error,
            "artifacts": list(self.artifacts),
            "origin": self.origin,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """A message from `to_dict`'s form, as an older Parley may have written it too
        (missing keys take their defaults, unknown ones are left out); ValueError names
        the first field of the wrong type."""
        role = data.get("role")
        if role not in ROLES:
            raise ValueError(f"message role {role!r} is not one of {sorted(ROLES)}")
        role = cast(Role, role)
        calls = _items(data, "tool_calls")
        if not all(isinstance(c, dict) for c in calls):
            raise ValueError("message field `tool_calls` must hold objects")
        blocks = _items(data, "reasoning_blocks")
        if not all(isinstance(b, dict) for b in blocks):
            raise ValueError("message field `reasoning_blocks` must hold objects")
        artifacts = _items(data, "artifacts")
        if not all(isinstance(a, str) for a in artifacts):
            raise ValueError("message field `artifacts` must hold strings")
        return cls(
            role=role,
            content=_text(data, "content"),
            tool_calls=tuple(
                ToolCall(_text(c, "id"), _text(c, "name"), _text(c, "arguments", "{}"))
                for c in calls
            ),
            reasoning=_text(data, "reasoning"),
            reasoning_blocks=tuple(blocks),
            tool_call_id=_optional_text(data, "tool_call_id"),
            name=_optional_text(data, "name"),
            is_error=bool(data.get("is_error", False)),
            artifacts=tuple(artifacts),
            origin=_text(data, "origin"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Message:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a stored message must be a JSON object")
        return cls.from_dict(data)

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


def forget_wire_json(messages: Iterable[Message]) -> None:
    """Drop the JSON each message keeps per wire format. It saves encoding the history
    again for every request of a turn; between turns a held conversation would keep a
    second copy of its whole text (about a third of its memory), and the next turn's
    first request encodes it again in well under a millisecond (docs/benchmarks.md)."""
    for message in messages:
        if message._json is not None:
            object.__setattr__(message, "_json", None)


def _text(data: Mapping[str, Any], key: str, default: str = "") -> str:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"message field `{key}` must be a string, not {type(value).__name__}")
    return value


def _optional_text(data: Mapping[str, Any], key: str) -> str | None:
    return None if data.get(key) is None else _text(data, key)


def _items(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list | tuple):
        raise ValueError(f"message field `{key}` must be a list, not {type(value).__name__}")
    return list(value)


CANCELLED_RESULT = "operation cancelled by user"
