"""Prompt caching on the wire (docs/cost.md#prompt-caching): the breakpoints and the cache
key in the exact bytes the fake LLM receives, and cached tokens read from each vendor's
usage, recorded shapes included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.events import StreamDone, Usage
from core.messages import TURN_MARK, Message, ToolCall
from core.providers import anthropic, openai_chat, openai_responses
from core.providers.base import CACHE_SCOPE, prompt_cache_key
from core.providers.builder import ResponseBuilder
from core.tools.base import ToolSpec
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, Reply

TOOLS = (
    ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}}),
    ToolSpec("fetch", "Fetch a page.", {"type": "object", "properties": {}}),
)
MARK = b'"cache_control":{"type":"ephemeral"}'


def history() -> list[Message]:
    """A system message with a per-turn part, and a tool round trip."""
    call = ToolCall(id="c1", name="lookup", arguments="{}")
    return [
        Message.system("You are Parley." + TURN_MARK + "Today is 2026-11-26 (UTC)."),
        Message.user("look it up"),
        Message.assistant("", (call,)),
        Message.tool_result(call, "found it"),
        Message.assistant("It is found."),
        Message.user("and again"),
    ]


async def send(fake_llm: FakeLLM, kind: str, conv: str = "slack:C1:1700.1", **kw: object) -> bytes:
    provider = provider_for(fake_llm, kind, **kw)
    token = CACHE_SCOPE.set(conv)
    try:
        await provider.complete(history(), TOOLS)
    finally:
        CACHE_SCOPE.reset(token)
        await provider.aclose()
    request = fake_llm.requests[-1]
    assert request.error is None, request.error
    return request.raw


async def test_anthropic_marks_tools_system_and_the_last_two_messages(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="ok"))
    raw = await send(fake_llm, "anthropic")
    assert raw.count(MARK) == 4  # the API's most
    body = json.loads(raw)
    assert [("cache_control" in t) for t in body["tools"]] == [False, True]
    stable, volatile = body["system"]
    assert stable == {
        "type": "text",
        "text": "You are Parley.",
        "cache_control": {"type": "ephemeral"},
    }
    assert volatile == {"type": "text", "text": "Today is 2026-11-26 (UTC)."}  # after the mark
    marked = [
        (i, j)
        for i, m in enumerate(body["messages"])
        for j, block in enumerate(m["content"])
        if "cache_control" in block
    ]
    last, before = len(body["messages"]) - 1, len(body["messages"]) - 2
    assert marked == [(before, len(body["messages"][before]["content"]) - 1), (last, 0)]
    assert "prompt_cache_key" not in body


async def test_anthropic_bytes_of_the_cached_prefix_do_not_move(fake_llm: FakeLLM) -> None:
    """Two calls of one turn: the second request repeats the first one's bytes (tools and
    system with their breakpoints, the history) up to the previous last two messages,
    whose breakpoints moved on to the new last two."""
    fake_llm.script(Reply(text="a"), Reply(text="b"))
    first = await send(fake_llm, "anthropic")
    provider = provider_for(fake_llm, "anthropic")
    messages = [*history(), Message.assistant("a"), Message.user("more")]
    await provider.complete(messages, TOOLS)
    await provider.aclose()
    second = fake_llm.requests[-1].raw
    common = next(
        (i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y), len(first)
    )
    assert first[:common].count(MARK) == 2
    assert first[common:].startswith(b',"cache_control"')  # the old breakpoint
    assert first[:common].endswith(b'"text":"It is found."')


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses"])
async def test_openai_sends_one_cache_key_per_conversation(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="1"), Reply(text="2"), Reply(text="3"), Reply(text="4"))
    one = await send(fake_llm, kind, "slack:C1:1700.1")
    again = await send(fake_llm, kind, "slack:C1:1700.1")
    other = await send(fake_llm, kind, "slack:C1:1800.2")
    key = prompt_cache_key("slack:C1:1700.1")
    assert f'"prompt_cache_key":"{key}"'.encode() in one
    assert f'"prompt_cache_key":"{key}"'.encode() in again
    assert json.loads(other)["prompt_cache_key"] == prompt_cache_key("slack:C1:1800.2") != key
    assert b"slack:C1" not in one.split(b'"prompt_cache_key"')[1][:40]  # a hash, not the id
    assert MARK not in one
    off = await send(fake_llm, kind, "slack:C1:1700.1", prompt_cache_key=False)
    assert b"prompt_cache_key" not in off


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses", "anthropic"])
async def test_cached_tokens_come_back_from_each_vendor(fake_llm: FakeLLM, kind: str) -> None:
    written = 100 if kind == "anthropic" else 0  # only Anthropic reports cache writes
    fake_llm.script(
        Reply(text="ok", usage=(1000, 20), cached_tokens=600, cache_write_tokens=written)
    )
    provider = provider_for(fake_llm, kind)
    done = await provider.complete(history(), TOOLS)
    await provider.aclose()
    assert done.usage == Usage(1000, 20, False, 600, written)


def test_recorded_anthropic_usage() -> None:
    """Shapes as the Messages API sends them: `input_tokens` leaves out cache reads and
    writes; `message_delta` may repeat the input usage, cumulatively."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet-4-5",
            "stop_reason": None,
            "usage": {
                "input_tokens": 21,
                "cache_creation_input_tokens": 188,
                "cache_read_input_tokens": 1_907,
                "output_tokens": 1,
                "service_tier": "standard",
            },
        },
    }
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 393},
    }
    builder = ResponseBuilder()
    for event in (start, delta):
        for wire in anthropic.parse(event["type"], json.dumps(event)):
            builder.add(wire)
    assert builder.usage == Usage(21 + 188 + 1_907, 393, False, 1_907, 188)
    again = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {
            "input_tokens": 5,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 2_095,
            "output_tokens": 12,
        },
    }
    for wire in anthropic.parse("message_delta", json.dumps(again)):
        builder.add(wire)
    assert builder.usage == Usage(2_100, 12, False, 2_095, 0)


def test_recorded_openai_usage() -> None:
    chunk = {
        "id": "chatcmpl-B9",
        "object": "chat.completion.chunk",
        "created": 1727000000,
        "model": "gpt-4o-2024-08-06",
        "choices": [],
        "usage": {
            "prompt_tokens": 2_006,
            "completion_tokens": 300,
            "total_tokens": 2_306,
            "prompt_tokens_details": {"cached_tokens": 1_920, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    }
    [usage] = openai_chat.parse("", json.dumps(chunk))
    assert usage == Usage(2_006, 300, False, 1_920, 0)
    no_details = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    assert openai_chat.parse("", json.dumps(no_details)) == [Usage(7, 1)]
    completed = {
        "type": "response.completed",
        "sequence_number": 9,
        "response": {
            "id": "resp_1",
            "status": "completed",
            "usage": {
                "input_tokens": 5_000,
                "input_tokens_details": {"cached_tokens": 4_864},
                "output_tokens": 40,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 5_040,
            },
        },
    }
    usage_event, _end = openai_responses.parse("response.completed", json.dumps(completed))
    assert usage_event == Usage(5_000, 40, False, 4_864, 0)


async def test_stream_done_carries_the_usage(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="ok", usage=(10, 2), cached_tokens=4))
    provider = provider_for(fake_llm, "openai_chat")
    events = [e async for e in provider.stream(history(), TOOLS)]
    await provider.aclose()
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.usage is not None
    assert done.usage.cached_tokens == 4


async def test_the_system_message_keeps_the_date_and_goal_after_the_cached_prefix(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.run(inbound("hello"), chat)
        await agent.submit(inbound("/goal create ship the release"), chat)
        await agent.run(inbound("again"), chat)
    first, second = (r.json["messages"][0]["content"] for r in fake_llm.requests)
    stable, volatile = first.split(TURN_MARK)
    assert "Today is" not in stable
    assert volatile.startswith("Today is ")
    assert second.startswith(stable + TURN_MARK)  # the stable part did not move
    assert "Active goal: ship the release" in second.split(TURN_MARK)[1]


def test_the_cache_key_goes_to_openai_by_default_and_elsewhere_when_asked(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from tests.agentkit import agent_config

    def key_sent(**provider: object) -> bool:
        config = agent_config(fake_llm, tmp_path, providers={"fake": provider})
        return config.providers["fake"].settings("fake", {}).prompt_cache_key

    assert not key_sent()  # the fake, like any server but OpenAI's, may not know the field
    assert key_sent(base_url="https://api.openai.com/v1")
    assert key_sent(prompt_cache_key=True)
    assert not key_sent(base_url="https://api.openai.com/v1", prompt_cache_key=False)
