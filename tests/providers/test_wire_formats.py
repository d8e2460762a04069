"""Each wire format's parser as a pure function: recorded server-sent events in, wire
events out; then the one `ResponseBuilder` assembling whole recorded streams.

No HTTP here: the same formats against a server on 127.0.0.1 are in `test_http.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

from core.events import ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta, Usage
from core.providers import KINDS, ProviderSettings, wire_format
from core.providers.anthropic import ANTHROPIC
from core.providers.builder import ResponseBuilder
from core.providers.openai_chat import OPENAI_CHAT
from core.providers.openai_responses import OPENAI_RESPONSES
from core.providers.wire import (
    InputUsage,
    Malformed,
    OutputUsage,
    ReasoningBlockDelta,
    ReasoningBlockStart,
    Refusal,
    StopReason,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
    UnindexedToolCall,
    WireError,
    WireEvent,
)

Recorded = tuple[str, str]  # (event name, data) of one server-sent event


def sse(event: str, data: dict[str, Any] | str) -> Recorded:
    return event, data if isinstance(data, str) else json.dumps(data)


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> Recorded:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse("", {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]})


def assemble(parse: Any, stream: Iterable[Recorded]) -> tuple[ResponseBuilder, list[StreamEvent]]:
    """What the HTTP provider does with a stream, minus the HTTP."""
    acc, shown = ResponseBuilder(), []
    for event, data in stream:
        for wire_event in parse(event, data):
            assert not isinstance(wire_event, WireError | Malformed), wire_event
            if (public := acc.add(wire_event)) is not None:
                shown.append(public)
    return acc, shown


# ---- OpenAI Chat Completions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (chat_chunk({"role": "assistant", "content": "Hel"}), [TextDelta("Hel")]),
        (chat_chunk({"reasoning_content": "hmm"}), [ReasoningDelta("hmm")]),
        (chat_chunk({"reasoning": "so"}), [ReasoningDelta("so")]),
        (chat_chunk({"refusal": "I can't."}), [Refusal("I can't.")]),
        (chat_chunk({}, finish="tool_calls"), [StopReason("tool_calls")]),
        (
            chat_chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q'},
                        }
                    ]
                }
            ),
            [ToolCallDelta(1, "call_b", "lookup", '{"q')],
        ),
        (
            chat_chunk({"tool_calls": [{"function": {"arguments": '":1}'}}]}),
            [UnindexedToolCall(None, None, '":1}')],
        ),
        (
            sse("", {"choices": [], "usage": {"prompt_tokens": 321, "completion_tokens": 12}}),
            [Usage(321, 12)],
        ),
        (sse("", "[DONE]"), [TurnEnd()]),
        (sse("", " [DONE]\n"), [TurnEnd()]),
    ],
)
def test_chat_chunk_becomes_wire_events(recorded: Recorded, expected: list[WireEvent]) -> None:
    assert list(OPENAI_CHAT.parse(*recorded)) == expected


GROQ_ERROR = {"message": "Failed to call a function.", "code": "tool_use_failed"}


@pytest.mark.parametrize(
    ("recorded", "error"),
    [
        (sse("error", {"error": GROQ_ERROR}), GROQ_ERROR),  # an `event: error`
        (sse("error", GROQ_ERROR), GROQ_ERROR),  # its bare error object
        (sse("error", "upstream went away"), {"message": "upstream went away"}),
        (sse("error", ""), {"message": "(no details)"}),
        (sse("", {"error": GROQ_ERROR}), GROQ_ERROR),  # the error as a chunk of its own
        (sse("", {"error": "overloaded"}), {"message": "overloaded"}),
    ],
)
def test_chat_errors_in_the_stream_are_wire_errors(
    recorded: Recorded, error: dict[str, Any]
) -> None:
    assert list(OPENAI_CHAT.parse(*recorded)) == [WireError(error)]


@pytest.mark.parametrize("wire", [OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC])
@pytest.mark.parametrize("data", ['{"choices": [', "[1, 2]", "not json"])
def test_malformed_data_is_reported_not_raised(wire: Any, data: str) -> None:
    assert list(wire.parse("", data)) == [Malformed(data)]


def test_parsing_is_pure() -> None:
    """The same event parses the same way whatever came before: no parser state."""
    fragment = chat_chunk({"tool_calls": [{"id": "c1", "function": {"name": "a"}}]})
    first = list(OPENAI_CHAT.parse(*fragment))
    for _ in range(3):
        assert list(OPENAI_CHAT.parse(*fragment)) == first
    added = sse(
        "",
        {
            "type": "response.output_item.added",
            "output_index": 4,
            "item": {"type": "function_call", "call_id": "c9", "name": "a", "arguments": ""},
        },
    )
    assert list(OPENAI_RESPONSES.parse(*added)) == list(OPENAI_RESPONSES.parse(*added))


def test_chat_stream_assembles_fragmented_calls_and_usage() -> None:
    stream = [
        chat_chunk({"role": "assistant", "content": "Checking"}),
        chat_chunk({"content": "."}),
        chat_chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "t1", "function": {"name": "lookup", "arguments": ""}}
                ]
            }
        ),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a"}'}}]}),
        chat_chunk({"tool_calls": [{"index": 1, "id": "t2", "function": {"name": "lookup"}}]}),
        chat_chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chat_chunk({}, finish="tool_calls"),
        sse("", {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9}}),
        sse("", "[DONE]"),
    ]
    acc, shown = assemble(OPENAI_CHAT.parse, stream)
    done = acc.done()
    assert acc.finished
    assert done.message.content == "Checking."
    assert [(c.id, c.name, c.arguments) for c in done.message.tool_calls] == [
        ("t1", "lookup", '{"q": "a"}'),
        ("t2", "lookup", "{}"),
    ]
    assert (done.stop_reason, done.usage) == ("tool_calls", Usage(50, 9))
    assert sum(isinstance(e, ToolCallDelta) for e in shown) == 5


def test_chat_fragments_without_index_are_matched_by_id_then_continued() -> None:
    def fragment(**fields: Any) -> Recorded:
        call_id = fields.pop("id", None)
        return chat_chunk({"tool_calls": [{"id": call_id, "function": fields}]})

    stream = [
        fragment(id="a", name="one", arguments='{"x"'),
        fragment(arguments=": 1}"),  # no id: continues the last call
        fragment(id="b", name="two", arguments="{}"),  # a new id: a new call
        fragment(id="a", arguments=""),  # a known id: that call
        sse("", "[DONE]"),
    ]
    acc, shown = assemble(OPENAI_CHAT.parse, stream)
    calls = acc.done().message.tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("a", "one", '{"x": 1}'),
        ("b", "two", "{}"),
    ]
    assert [e.index for e in shown if isinstance(e, ToolCallDelta)] == [0, 0, 1, 0]


def test_chat_refusal_is_the_answer() -> None:
    stream = [chat_chunk({"refusal": "I can't "}), chat_chunk({"refusal": "help."}, "stop")]
    acc, shown = assemble(OPENAI_CHAT.parse, [*stream, sse("", "[DONE]")])
    done = acc.done()
    assert (done.message.content, done.stop_reason) == ("I can't help.", "refusal")
    assert shown == [TextDelta("I can't "), TextDelta("help.")]


# ---- OpenAI Responses ---------------------------------------------------------------------


def responses_event(kind: str, **fields: Any) -> Recorded:
    return sse(kind, {"type": kind, "sequence_number": 1, **fields})


def function_call_added(output_index: int, call_id: str, name: str) -> Recorded:
    item = {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name}
    return responses_event(
        "response.output_item.added", output_index=output_index, item={**item, "arguments": ""}
    )


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (responses_event("response.output_text.delta", delta="Hi"), [TextDelta("Hi")]),
        (responses_event("response.refusal.delta", delta="No."), [Refusal("No.")]),
        (
            responses_event("response.reasoning_summary_text.delta", delta="think"),
            [ReasoningDelta("think")],
        ),
        (
            function_call_added(2, "c1", "lookup"),
            [ToolCallStart(2, "c1", "lookup", ""), StopReason("tool_calls")],
        ),
        (
            responses_event("response.function_call_arguments.delta", output_index=2, delta="{"),
            [ToolCallArguments(2, "{", new_if_unknown=True), StopReason("tool_calls")],
        ),
        (
            responses_event(
                "response.completed",
                response={"status": "completed", "usage": {"input_tokens": 7, "output_tokens": 3}},
            ),
            [Usage(7, 3), TurnEnd()],
        ),
        (responses_event("response.completed", response={"status": "completed"}), [TurnEnd()]),
        (
            responses_event("response.output_item.added", output_index=0, item={"type": "message"}),
            [],
        ),
        (responses_event("response.in_progress"), []),
    ],
)
def test_responses_event_becomes_wire_events(recorded: Recorded, expected: list[WireEvent]) -> None:
    assert list(OPENAI_RESPONSES.parse(*recorded)) == expected


OVERFLOW = {"message": "Your input exceeds the context window", "code": "context_length_exceeded"}


@pytest.mark.parametrize(
    ("recorded", "error"),
    [
        (responses_event("error", **OVERFLOW), OVERFLOW),
        (responses_event("response.failed", response={"error": OVERFLOW}), OVERFLOW),
        (
            responses_event(
                "response.incomplete", response={"incomplete_details": {"reason": "max"}}
            ),
            {"reason": "max"},
        ),
    ],
)
def test_responses_failures_are_wire_errors(recorded: Recorded, error: dict[str, Any]) -> None:
    assert list(OPENAI_RESPONSES.parse(*recorded)) == [WireError(error)]


def test_responses_stream_numbers_calls_among_output_items() -> None:
    stream = [
        responses_event("response.created", response={"status": "in_progress"}),
        responses_event("response.output_item.added", output_index=0, item={"type": "message"}),
        responses_event("response.output_text.delta", output_index=0, delta="Two lookups."),
        function_call_added(1, "c1", "lookup"),
        responses_event("response.function_call_arguments.delta", output_index=1, delta='{"q":'),
        function_call_added(2, "c2", "lookup"),
        responses_event("response.function_call_arguments.delta", output_index=2, delta="{}"),
        responses_event("response.function_call_arguments.delta", output_index=1, delta='"a"}'),
        responses_event(
            "response.completed", response={"usage": {"input_tokens": 9, "output_tokens": 4}}
        ),
    ]
    acc, shown = assemble(OPENAI_RESPONSES.parse, stream)
    done = acc.done()
    assert [(c.id, c.arguments) for c in done.message.tool_calls] == [
        ("c1", '{"q":"a"}'),
        ("c2", "{}"),
    ]
    assert [e.index for e in shown if isinstance(e, ToolCallDelta)] == [0, 0, 1, 1, 0]
    assert (done.message.content, done.stop_reason, done.usage) == (
        "Two lookups.",
        "tool_calls",
        Usage(9, 4),
    )


def test_responses_text_only_turn_stops_with_stop() -> None:
    stream = [
        responses_event("response.output_text.delta", delta="Hi."),
        responses_event("response.completed", response={}),
    ]
    acc, _ = assemble(OPENAI_RESPONSES.parse, stream)
    assert (acc.finished, acc.done().stop_reason, acc.done().usage) == (True, "stop", None)


# ---- Anthropic Messages -------------------------------------------------------------------


def anthropic_event(kind: str, **fields: Any) -> Recorded:
    return sse(kind, {"type": kind, **fields})


def block_start(index: int, **block: Any) -> Recorded:
    return anthropic_event("content_block_start", index=index, content_block=block)


def block_delta(index: int, **delta: Any) -> Recorded:
    return anthropic_event("content_block_delta", index=index, delta=delta)


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        (
            anthropic_event("message_start", message={"usage": {"input_tokens": 25}}),
            [InputUsage(25, 0)],
        ),
        (block_start(0, type="text", text=""), []),
        (block_start(0, type="text", text="Hi"), [TextDelta("Hi")]),
        (block_delta(0, type="text_delta", text="there"), [TextDelta("there")]),
        (
            block_start(1, type="tool_use", id="tu1", name="lookup", input={}),
            [ToolCallStart(1, "tu1", "lookup")],
        ),
        (
            block_delta(1, type="input_json_delta", partial_json='{"q"'),
            [ToolCallArguments(1, '{"q"')],
        ),
        (block_start(1, type="server_tool_use", id="s1", name="web_search"), []),
        (
            block_start(0, type="thinking", thinking=""),
            [ReasoningBlockStart(0, {"type": "thinking", "thinking": ""})],
        ),
        (
            block_delta(0, type="thinking_delta", thinking="hmm"),
            [ReasoningBlockDelta(0, "thinking", "hmm")],
        ),
        (
            block_delta(0, type="signature_delta", signature="sig"),
            [ReasoningBlockDelta(0, "signature", "sig")],
        ),
        (
            anthropic_event(
                "message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 15}
            ),
            [StopReason("tool_use"), OutputUsage(15)],
        ),
        (anthropic_event("message_stop"), [TurnEnd()]),
        (anthropic_event("ping"), []),
        (
            anthropic_event("error", error={"type": "overloaded_error", "message": "Overloaded"}),
            [WireError({"type": "overloaded_error", "message": "Overloaded"})],
        ),
    ],
)
def test_anthropic_event_becomes_wire_events(recorded: Recorded, expected: list[WireEvent]) -> None:
    assert list(ANTHROPIC.parse(*recorded)) == expected


def test_anthropic_stream_keeps_thinking_verbatim_and_drops_server_tool_input() -> None:
    stream = [
        anthropic_event(
            "message_start", message={"usage": {"input_tokens": 120, "output_tokens": 1}}
        ),
        block_start(0, type="thinking", thinking=""),
        block_delta(0, type="thinking_delta", thinking="step by "),
        block_delta(0, type="thinking_delta", thinking="step"),
        block_delta(0, type="signature_delta", signature="EqQB"),
        anthropic_event("content_block_stop", index=0),
        block_start(1, type="server_tool_use", id="srv1", name="web_search", input={}),
        block_delta(1, type="input_json_delta", partial_json='{"query": "x"}'),
        block_start(2, type="text", text=""),
        block_delta(2, type="text_delta", text="Found it."),
        block_start(3, type="tool_use", id="tu1", name="lookup", input={}),
        block_delta(3, type="input_json_delta", partial_json='{"q": '),
        block_delta(3, type="input_json_delta", partial_json='"x"}'),
        block_delta(7, type="thinking_delta", thinking="of a block never started"),
        anthropic_event(
            "message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 42}
        ),
        anthropic_event("message_stop"),
    ]
    acc, shown = assemble(ANTHROPIC.parse, stream)
    done = acc.done()
    assert done.message.content == "Found it."
    assert done.message.reasoning == "step by step"
    assert done.message.reasoning_blocks == (
        {"type": "thinking", "thinking": "step by step", "signature": "EqQB"},
    )
    assert [(c.id, c.name, c.arguments) for c in done.message.tool_calls] == [
        ("tu1", "lookup", '{"q": "x"}')
    ]
    assert (done.stop_reason, done.usage) == ("tool_use", Usage(120, 42))
    assert [e for e in shown if isinstance(e, Usage)] == [Usage(120, 42)]  # not the start's
    assert [e.index for e in shown if isinstance(e, ToolCallDelta)] == [0, 0, 0]


# ---- request bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_body_omits_tools_and_temperature_unless_given(kind: str) -> None:
    from core.messages import Message

    wire = wire_format(kind)
    settings = ProviderSettings("p", kind, "http://x", "m", max_output_tokens=99)
    body = wire.build_body([Message.system("sys"), Message.user("hi")], (), settings)
    assert body["model"] == "m"
    assert body["stream"] is True
    assert "tools" not in body
    assert "temperature" not in body
    warm = ProviderSettings("p", kind, "http://x", "m", temperature=0.5)
    assert wire.build_body([Message.user("hi")], (), warm)["temperature"] == 0.5


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("openai_chat", {"Authorization": "Bearer k"}),
        ("openai_responses", {"Authorization": "Bearer k"}),
        ("anthropic", {"anthropic-version": "2023-06-01", "x-api-key": "k"}),
    ],
)
def test_each_format_says_how_the_key_is_sent(kind: str, expected: dict[str, str]) -> None:
    assert wire_format(kind).headers("k") == expected
    assert "k" not in json.dumps(wire_format(kind).headers(None))
