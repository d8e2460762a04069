"""Request bodies joined from cached JSON parts read the same as bodies encoded whole."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import Message, ToolCall
from core.providers import wire_format
from core.providers.base import ProviderSettings
from core.providers.jsonbody import Raw, RawList, encode_body
from core.tools.base import ToolSpec

KINDS = ("openai_chat", "openai_responses", "anthropic")
TOOLS = (
    ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {}}}),
    ToolSpec("bash", "Run — a command.", {"type": "object"}),
)
text = st.text(max_size=40)  # any code point, lone surrogates included


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out = [Message.system(draw(text))]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "tool"]))
        if kind == "user":
            out.append(Message.user(draw(text)))
        elif kind == "assistant":
            out.append(Message.assistant(draw(text)))
        elif kind == "call":
            args = json.dumps({"path": draw(text)})
            out.append(
                Message.assistant(draw(text), (ToolCall(id="c1", name="bash", arguments=args),))
            )
        else:
            call = ToolCall(id="c1", name="bash")
            out.append(Message.tool_result(call, draw(text), is_error=draw(st.booleans())))
    return out


def fresh(messages: list[Message]) -> list[Message]:
    """The same messages as new objects, with nothing cached on them."""
    return [Message.from_dict(m.to_dict()) for m in messages]


def decoded(kind: str, messages: list[Message], tools: tuple[ToolSpec, ...]) -> Any:
    wire = wire_format(kind)
    settings_ = ProviderSettings("p", kind, "http://x", "m", temperature=0.2)
    return json.loads(encode_body(wire.build_body(messages, tools, settings_)))


@pytest.mark.parametrize("kind", KINDS)
@given(history=histories(), extra=histories())
@settings(max_examples=60, deadline=None)
def test_a_body_from_cached_parts_reads_as_one_encoded_afresh(
    kind: str, history: list[Message], extra: list[Message]
) -> None:
    decoded(kind, history, TOOLS)  # the parts of `history` are now cached
    grown = [*history, *extra[1:]]
    assert decoded(kind, grown, TOOLS) == decoded(kind, fresh(grown), TOOLS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_with_new_content_is_encoded_again(kind: str) -> None:
    old = Message.user("the whole long output")
    decoded(kind, [old], ())
    cut = old.with_changes(content="[cut]")
    assert "[cut]" in json.dumps(decoded(kind, [cut], ()))
    assert "whole long" not in json.dumps(decoded(kind, [cut], ()))


def test_tool_lists_are_encoded_once_per_tuple_and_never_reused_for_another() -> None:
    chat = wire_format("openai_chat")
    s = ProviderSettings("p", "openai_chat", "http://x", "m")
    first = chat.build_body([Message.user("hi")], TOOLS, s)["tools"]
    assert chat.build_body([Message.user("hi")], TOOLS, s)["tools"] is first
    other = (TOOLS[0],)
    assert [t["function"]["name"] for t in json.loads(chat.build_body([], other, s)["tools"])] == [
        "read_file"
    ]


def test_raw_parts_are_written_as_they_are_and_empty_items_left_out() -> None:
    body = {"a": RawList([Raw('{"x":1}'), Raw(""), Raw('"y"')]), "b": Raw("[1,2]"), "c": "é"}
    assert encode_body(body) == b'{"a":[{"x":1},"y"],"b":[1,2],"c":"\\u00e9"}'
