"""Wire tests for each provider against the fake LLM: streaming, fragment merging,
retries honouring Retry-After, permanent errors, cut streams, thinking blocks."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from core.errors import ContextLengthError, ProviderAuthError, ProviderError, ProviderUnavailable
from core.events import StreamDone, StreamEvent, StreamRestarted, TextDelta, ToolCallDelta, Usage
from core.messages import Message
from core.providers.transport import backoff_delay
from core.tools.base import ToolSpec
from tests.conftest import provider_for
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec

KINDS = ["openai_chat", "openai_responses", "anthropic"]
TOOLS = (ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}}),)


async def collect(provider: object, messages: list[Message] | None = None) -> list[StreamEvent]:
    msgs = messages or [Message.system("sys"), Message.user("hi")]
    return [e async for e in provider.stream(msgs, TOOLS)]  # type: ignore[attr-defined]


def done_of(events: list[StreamEvent]) -> StreamDone:
    assert isinstance(events[-1], StreamDone)
    return events[-1]


@pytest.mark.parametrize("kind", KINDS)
async def test_text_streams_in_fragments(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="The quick brown fox jumps over the lazy dog.", chunk_size=5))
    events = await collect(provider_for(fake_llm, kind))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 5
    assert "".join(deltas) == "The quick brown fox jumps over the lazy dog."
    assert done_of(events).message.content == "".join(deltas)


@pytest.mark.parametrize("kind", KINDS)
async def test_tool_call_fragments_merged_by_index(fake_llm: FakeLLM, kind: str) -> None:
    args_a = {"query": "a" * 40, "nested": {"k": [1, 2, 3]}}
    args_b = {"query": "second"}
    fake_llm.script(
        Reply(
            text="Checking.",
            tool_calls=[
                ToolCallSpec("lookup", args_a, id="t1"),
                ToolCallSpec("lookup", args_b, id="t2"),
            ],
            chunk_size=4,
        )
    )
    events = await collect(provider_for(fake_llm, kind))
    fragments = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(fragments) > 4  # really fragmented on the wire
    message = done_of(events).message
    assert [(c.id, c.name) for c in message.tool_calls] == [("t1", "lookup"), ("t2", "lookup")]
    assert [json.loads(c.arguments) for c in message.tool_calls] == [args_a, args_b]
    assert message.content == "Checking."


@pytest.mark.parametrize("kind", KINDS)
async def test_usage_recorded(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="hi", usage=(321, 12)))
    events = await collect(provider_for(fake_llm, kind))
    usage = done_of(events).usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (321, 12)
    assert any(isinstance(e, Usage) for e in events)


@pytest.mark.parametrize("kind", KINDS)
async def test_429_retried_honouring_retry_after(fake_llm: FakeLLM, kind: str) -> None:
    clock = FakeClock()
    fake_llm.script(Reply(fault=Fault(status=429, retry_after=7)), Reply(text="after the wait"))
    events = await collect(provider_for(fake_llm, kind, clock))
    assert done_of(events).message.content == "after the wait"
    assert len(clock.sleeps) == 1
    assert 7 <= clock.sleeps[0] < 7.2
    restarted = [e for e in events if isinstance(e, StreamRestarted)]
    assert len(restarted) == 1
    assert not restarted[0].discard
    assert len(fake_llm.requests) == 2
    assert fake_llm.requests[0].json == fake_llm.requests[1].json  # the full request re-sent


@pytest.mark.parametrize("kind", KINDS)
async def test_5xx_retried_with_backoff_then_gives_up(fake_llm: FakeLLM, kind: str) -> None:
    clock = FakeClock()
    fake_llm.script(*(Reply(fault=Fault(status=500)) for _ in range(4)))
    with pytest.raises(ProviderUnavailable) as info:
        await collect(provider_for(fake_llm, kind, clock))
    assert info.value.status == 500
    assert len(fake_llm.requests) == 4  # first try + 3 retries
    assert len(clock.sleeps) == 3
    assert clock.sleeps[0] <= 1.0 < clock.sleeps[2]  # exponential


@pytest.mark.parametrize("kind", KINDS)
async def test_401_is_not_retried(fake_llm: FakeLLM, kind: str) -> None:
    clock = FakeClock()
    fake_llm.script(Reply(fault=Fault(status=401, message="bad key")))
    with pytest.raises(ProviderAuthError, match="bad key"):
        await collect(provider_for(fake_llm, kind, clock))
    assert len(fake_llm.requests) == 1
    assert clock.sleeps == []


async def test_real_auth_check_rejects_wrong_key() -> None:
    async with FakeLLM(api_key="right") as fake:
        fake.script(Reply(text="never"))
        with pytest.raises(ProviderAuthError):
            await collect(provider_for(fake, "anthropic"))  # provider sends key "k"


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_cut_midway_restarts_and_discards(fake_llm: FakeLLM, kind: str) -> None:
    clock = FakeClock()
    fake_llm.script(
        Reply(text="partial answer that will be cut", chunk_size=3, fault=Fault(cut_after=8)),
        Reply(text="complete answer"),
    )
    events = await collect(provider_for(fake_llm, kind, clock))
    restarted = [e for e in events if isinstance(e, StreamRestarted)]
    assert len(restarted) == 1
    assert restarted[0].discard
    assert done_of(events).message.content == "complete answer"


@pytest.mark.parametrize("kind", KINDS)
async def test_cut_before_first_byte_is_retried(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="x", fault=Fault(cut_after=0)), Reply(text="second try"))
    events = await collect(provider_for(fake_llm, kind, FakeClock()))
    assert done_of(events).message.content == "second try"


async def test_slow_chunks_arrive_in_order(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="slow but steady", chunk_size=2, chunk_delay=0.02))
    events = await collect(provider_for(fake_llm))
    assert done_of(events).message.content == "slow but steady"


async def test_context_length_error_is_typed_and_not_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(
        Reply(fault=Fault(status=400, message="This model's maximum context length is 8192"))
    )
    with pytest.raises(ContextLengthError):
        await collect(provider_for(fake_llm))
    assert len(fake_llm.requests) == 1


async def test_unreachable_server_is_provider_unavailable() -> None:
    from core.providers import ProviderSettings, build_provider

    settings = ProviderSettings("dead", "openai_chat", "http://127.0.0.1:9/v1", "m", max_retries=1)
    provider = build_provider(settings, clock=FakeClock())
    with pytest.raises(ProviderUnavailable, match="connection"):
        await collect(provider)
    await provider.aclose()


async def test_anthropic_thinking_blocks_sent_back_verbatim(fake_llm: FakeLLM) -> None:
    fake_llm.script(
        Reply(reasoning="step by step", tool_calls=[ToolCallSpec("lookup", {}, id="tu1")]),
        Reply(text="done"),
    )
    provider = provider_for(fake_llm, "anthropic")
    messages = [Message.system("sys"), Message.user("hi")]
    first = done_of(await collect(provider, messages)).message
    assert first.reasoning == "step by step"
    [block] = first.reasoning_blocks
    assert block["type"] == "thinking"
    assert block["thinking"] == "step by step"
    assert block.get("signature")
    messages += [first, Message.tool_result(first.tool_calls[0], "result")]
    await collect(provider, messages)
    sent = fake_llm.requests[1].json
    assert [b["text"] for b in sent["system"]] == ["sys"]
    assistant = sent["messages"][1]
    assert assistant["content"][0] == block
    assert sent["messages"][2]["content"][0]["tool_use_id"] == "tu1"


async def test_permanent_error_message_comes_from_body(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(fault=Fault(status=404, message="no such model: fake")))
    with pytest.raises(ProviderError, match="no such model"):
        await collect(provider_for(fake_llm, "openai_responses"))


def test_backoff_grows_and_is_capped() -> None:
    delays = [backoff_delay(n, None) for n in range(8)]
    assert all(0 < d <= 30 for d in delays)
    assert 30 >= backoff_delay(10, None) >= 15
    assert backoff_delay(0, 120) <= 60.1


@pytest.mark.parametrize("kind", KINDS)
async def test_connection_is_reused_across_calls(fake_llm: FakeLLM, kind: str) -> None:
    """Reading each stream to its end returns the connection to the pool: one TCP (and, in
    production, TLS) handshake per conversation, not per LLM call."""
    fake_llm.script(
        *(Reply(text=f"answer {n}", tool_calls=[ToolCallSpec("lookup", {})]) for n in range(3))
    )
    provider = provider_for(fake_llm, kind)
    for _ in range(3):
        await collect(provider)
    assert len(fake_llm.requests) == 3
    assert fake_llm.connections == 1


# ---- errors inside the stream, real context-overflow answers, refusals, server tools ----

ErrorShape = Literal["event", "data", "failed"]
GROQ_TOOL_USE_FAILED = {
    "message": "Failed to call a function. Please adjust your prompt. "
    "See 'failed_generation' for more details.",
    "type": "invalid_request_error",
    "code": "tool_use_failed",
    "failed_generation": '<function=lookup{"query": "x"}</function>',
}
ANTHROPIC_OVERFLOW_MESSAGE = (
    "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, "
    "decrease input length or `max_tokens` and try again"
)
RESPONSES_OVERFLOW = {
    "message": "Your input exceeds the context window of this model. "
    "Please adjust your input and try again.",
    "type": "invalid_request_error",
    "param": "input",
    "code": "context_length_exceeded",
}


@pytest.mark.parametrize("shape", ["event", "data"])
async def test_chat_stream_error_reaches_the_user_at_once(
    fake_llm: FakeLLM, shape: ErrorShape
) -> None:
    clock = FakeClock()
    fault = Fault(stream_error=GROQ_TOOL_USE_FAILED, stream_error_as=shape)
    fake_llm.script(Reply(text="never sent", fault=fault))
    provider = provider_for(fake_llm, "openai_chat", clock)
    events: list[object] = []
    with pytest.raises(ProviderError) as info:
        await provider.complete([Message.user("hi")], TOOLS, events.append)
    assert "Failed to call a function. Please adjust your prompt." in str(info.value)
    assert "failed_generation" in str(info.value)
    assert info.value.code == "tool_use_failed"
    assert not info.value.retryable
    assert not isinstance(info.value, ProviderUnavailable)
    assert len(fake_llm.requests) == 1  # not retried as a cut stream
    assert clock.sleeps == []
    assert not any(isinstance(e, StreamRestarted) for e in events)


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses"])
async def test_server_error_in_the_stream_is_retried_with_its_message(
    fake_llm: FakeLLM, kind: str
) -> None:
    server_error = {
        "message": "The server had an error while processing your request.",
        "type": "server_error",
        "code": "server_error",
    }
    fake_llm.script(Reply(fault=Fault(stream_error=server_error)), Reply(text="second try"))
    events = await collect(provider_for(fake_llm, kind, FakeClock()))
    [restarted] = [e for e in events if isinstance(e, StreamRestarted)]
    assert "The server had an error while processing your request." in restarted.reason
    assert done_of(events).message.content == "second try"


@pytest.mark.parametrize(
    ("kind", "error", "shape"),
    [
        (
            "openai_chat",
            {
                "message": "This model's maximum context length is 8192 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            },
            "event",
        ),
        ("openai_responses", RESPONSES_OVERFLOW, "event"),
        ("openai_responses", RESPONSES_OVERFLOW, "failed"),
        (
            "anthropic",
            {"type": "invalid_request_error", "message": ANTHROPIC_OVERFLOW_MESSAGE},
            "event",
        ),
    ],
)
async def test_context_overflow_in_the_stream_is_a_context_length_error(
    fake_llm: FakeLLM, kind: str, error: dict[str, str], shape: ErrorShape
) -> None:
    clock = FakeClock()
    fault = Fault(stream_error=error, stream_error_as=shape)
    fake_llm.script(Reply(text="never sent", fault=fault))
    with pytest.raises(ContextLengthError, match="context"):
        await collect(provider_for(fake_llm, kind, clock))
    assert len(fake_llm.requests) == 1
    assert clock.sleeps == []


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (
            "anthropic",
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": ANTHROPIC_OVERFLOW_MESSAGE},
            },
        ),
        ("openai_responses", {"error": RESPONSES_OVERFLOW}),
    ],
)
async def test_recorded_context_overflow_answers_are_context_length_errors(
    fake_llm: FakeLLM, kind: str, body: dict[str, object]
) -> None:
    fake_llm.script(Reply(fault=Fault(status=400, body=body)))
    with pytest.raises(ContextLengthError) as info:
        await collect(provider_for(fake_llm, kind))
    assert info.value.status == 400
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses"])
async def test_a_refusal_is_the_answer(fake_llm: FakeLLM, kind: str) -> None:
    refusal = "I'm sorry, but I can't help with that request."
    fake_llm.script(Reply(refusal=refusal, chunk_size=6))
    events = await collect(provider_for(fake_llm, kind))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == refusal
    done = done_of(events)
    assert done.message.content == refusal
    assert done.stop_reason == "refusal"


@pytest.mark.parametrize("block_type", ["server_tool_use", "some_future_tool_use"])
async def test_anthropic_deltas_of_untracked_blocks_are_ignored(
    fake_llm: FakeLLM, block_type: str
) -> None:
    fake_llm.script(
        Reply(
            text="Found it.",
            server_tool_calls=[ToolCallSpec("web_search", {"query": "parley chat ops"})],
            server_tool_type=block_type,
            tool_calls=[ToolCallSpec("lookup", {"q": "x"}, id="t1")],
            chunk_size=4,
        )
    )
    events = await collect(provider_for(fake_llm, "anthropic"))
    message = done_of(events).message
    assert message.content == "Found it."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in message.tool_calls] == [
        ("t1", "lookup", {"q": "x"})
    ]
