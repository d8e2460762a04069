"""A message's stored form (docs/durability.md): `Message.to_json` writes every field and
`Message.from_json` reads what this or an older Parley wrote, converting lists back to
tuples, and refuses a row whose fields have the wrong types with an error that names the
field (a row is never half-read into a message the providers would choke on)."""

from __future__ import annotations

import json

import pytest

from core.messages import Message, ToolCall
from tests.store.samples import history


def test_every_sample_message_survives_the_round_trip_with_its_caches_left_behind() -> None:
    for message in history():
        object.__setattr__(message, "_tokens", 42)  # a cached count is not stored
        again = Message.from_json(message.to_json())
        assert again == message
        assert again._tokens is None
        assert isinstance(again.tool_calls, tuple)
        assert isinstance(again.artifacts, tuple)


def test_a_row_written_before_later_fields_existed_reads_with_their_defaults() -> None:
    old = {"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1", "name": "ls"}]}
    message = Message.from_json(json.dumps(old | {"retired_field": 1}))
    assert message == Message.assistant("hi", (ToolCall("c1", "ls", "{}"),))
    assert (message.origin, message.reasoning_blocks, message.is_error) == ("", (), False)


@pytest.mark.parametrize(
    ("row", "named"),
    [
        ({"role": "robot"}, "role"),
        ({"role": "user", "content": 7}, "content"),
        ({"role": "assistant", "tool_calls": "ls"}, "tool_calls"),
        ({"role": "assistant", "tool_calls": [["c1", "ls"]]}, "tool_calls"),
        ({"role": "assistant", "tool_calls": [{"id": 1, "name": "ls"}]}, "id"),
        ({"role": "assistant", "reasoning_blocks": ["x"]}, "reasoning_blocks"),
        ({"role": "tool", "artifacts": [3]}, "artifacts"),
        ({"role": "tool", "tool_call_id": ["c1"]}, "tool_call_id"),
    ],
)
def test_a_row_with_a_field_of_the_wrong_type_is_refused_by_name(
    row: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        Message.from_json(json.dumps(row))


def test_a_copy_with_changes_drops_the_cached_count_and_json() -> None:
    message = Message.user("a long text")
    object.__setattr__(message, "_tokens", 9)
    object.__setattr__(message, "_json", {"openai_chat": "{}"})
    cut = message.with_changes(content="[cut]")
    assert (cut.content, cut._tokens, cut._json) == ("[cut]", None, None)
    assert message._tokens == 9  # the original keeps its own
