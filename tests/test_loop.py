"""The agent loop against the fake LLM over real HTTP: scenarios S5.1–S5.8 and the rest of
docs/loop.md (parallel reads, empty turns, reasoning, cancel grace)."""

from __future__ import annotations

import asyncio
import json

import pytest

from core.events import LoopEvent, ReasoningDelta, TextDelta, ToolFinished, ToolStarted, Usage
from core.loop import EMPTY_TURNS_TEXT, MAX_ITERATIONS_TEXT, LoopConfig, run_loop
from core.messages import CANCELLED_RESULT, Message
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.helpers import EchoTool, FailingTool, SleepTool

KINDS = ["openai_chat", "openai_responses", "anthropic"]


def executor(*tools: object, sandbox: SandboxSettings | None = None) -> ToolExecutor:
    return ToolExecutor(
        ToolRegistry(tools),  # type: ignore[arg-type]
        ToolPolicy(),
        ToolContext(sandbox=sandbox or SandboxSettings()),
    )


def history(text: str = "hello") -> list[Message]:
    return [Message.system("You are a test."), Message.user(text)]


def tool_results(request_json: dict[str, object], api: str) -> list[tuple[str, str]]:
    """(call id, text) of every tool result a request sent, whatever the wire format."""
    out: list[tuple[str, str]] = []
    if api == "chat":
        for m in request_json["messages"]:  # type: ignore[attr-defined]
            if m["role"] == "tool":
                out.append((m["tool_call_id"], m["content"]))
    elif api == "responses":
        for item in request_json["input"]:  # type: ignore[attr-defined]
            if item.get("type") == "function_call_output":
                out.append((item["call_id"], item["output"]))
    else:
        for m in request_json["messages"]:  # type: ignore[attr-defined]
            for block in m["content"] if isinstance(m["content"], list) else []:
                if block.get("type") == "tool_result":
                    out.append((block["tool_use_id"], block["content"]))
    return out


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_1_no_tools_single_iteration(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="Hello there, human."))
    messages = history()
    outcome = await run_loop(messages, provider_for(fake_llm, kind), executor())
    assert outcome.reason == "final"
    assert outcome.text == "Hello there, human."
    assert outcome.iterations == 1
    assert len(fake_llm.requests) == 1
    assert "tools" not in fake_llm.requests[0].json  # no tools registered: field omitted
    assert messages[-1] == Message.assistant("Hello there, human.")
    fake_llm.assert_complete()


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_2_tool_result_goes_back_to_llm(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("echo", {"text": "ping"}, id="c1")]),
        Reply(text="The tool said ping."),
    )
    outcome = await run_loop(history(), provider_for(fake_llm, kind), executor(EchoTool()))
    assert outcome.text == "The tool said ping."
    second = fake_llm.requests[1]
    assert tool_results(second.json, second.api) == [("c1", "echo: ping")]
    assert outcome.iterations == 2
    fake_llm.assert_complete()


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_3_several_tool_calls_in_one_turn(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("echo", {"text": "one"}, id="a"),
                ToolCallSpec("echo", {"text": "two"}, id="b"),
                ToolCallSpec("echo", {"text": "three"}, id="c"),
            ],
            chunk_size=3,
        ),
        Reply(text="done"),
    )
    messages = history()
    await run_loop(messages, provider_for(fake_llm, kind), executor(EchoTool()))
    second = fake_llm.requests[1]
    assert tool_results(second.json, second.api) == [
        ("a", "echo: one"),
        ("b", "echo: two"),
        ("c", "echo: three"),
    ]
    assert [m.role for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
    ]


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_4_tool_error_returned_as_content(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("explode", {"text": "x"}, id="e1")]),
        Reply(text="The tool failed: disk on fire."),
    )
    messages = history()
    outcome = await run_loop(messages, provider_for(fake_llm, kind), executor(FailingTool()))
    assert outcome.reason == "final"
    result = next(m for m in messages if m.role == "tool")
    assert result.is_error
    assert "disk on fire" in result.content
    second = fake_llm.requests[1]
    [(call_id, text)] = tool_results(second.json, second.api)
    assert call_id == "e1"
    assert "disk on fire" in text
    if kind == "anthropic":
        blocks = [
            b
            for m in second.json["messages"]
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        assert blocks[0]["is_error"] is True


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_5_cancel_mid_stream_exits_cleanly(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="word " * 200, chunk_size=5, chunk_delay=0.05))
    messages = history()
    first_text = asyncio.Event()

    def sink(event: LoopEvent) -> None:
        if isinstance(event, TextDelta):
            first_text.set()

    task = asyncio.create_task(
        run_loop(messages, provider_for(fake_llm, kind), executor(), ctx=RunContext(sink=sink))
    )
    await asyncio.wait_for(first_text.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done
    assert task.cancelled()
    await fake_llm.wait_for_disconnects(1, timeout=2)  # the HTTP stream was closed at once
    assert [m.role for m in messages] == ["system", "user"]  # nothing half-streamed kept


@pytest.mark.parametrize("kind", KINDS)
async def test_s5_6_multi_turn_tool_loop(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("echo", {"text": "1"})]),
        Reply(text="thinking out loud", tool_calls=[ToolCallSpec("echo", {"text": "2"})]),
        Reply(tool_calls=[ToolCallSpec("echo", {"text": "3"})]),
        Reply(text="All three done."),
    )
    messages = history()
    outcome = await run_loop(messages, provider_for(fake_llm, kind), executor(EchoTool()))
    assert outcome.text == "All three done."
    assert outcome.iterations == 4
    assert outcome.tool_calls == 3
    assert [m.content for m in messages if m.role == "tool"] == ["echo: 1", "echo: 2", "echo: 3"]
    fake_llm.assert_complete()


async def test_s5_7_max_iterations_terminal_message(fake_llm: FakeLLM) -> None:
    fake_llm.responder = lambda _req: Reply(tool_calls=[ToolCallSpec("echo", {"text": "again"})])
    messages = history()
    notices: list[LoopEvent] = []
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        executor(EchoTool()),
        config=LoopConfig(max_iterations=3),
        ctx=RunContext(sink=notices.append),
    )
    assert outcome.reason == "max_iterations"
    assert outcome.text == MAX_ITERATIONS_TEXT == "Stopped: maximum iteration limit reached."
    assert messages[-1] == Message.assistant(MAX_ITERATIONS_TEXT)
    assert len(fake_llm.requests) == 3
    assert any(getattr(e, "text", None) == MAX_ITERATIONS_TEXT for e in notices)


@pytest.mark.parametrize("phase", ["stream", "tool"])
async def test_s5_8_cancel_reaches_stream_and_tool(fake_llm: FakeLLM, phase: str) -> None:
    sleeper = SleepTool("sleep_read", "read")
    if phase == "stream":
        fake_llm.script(Reply(text="x" * 400, chunk_size=4, chunk_delay=0.05))
    else:
        fake_llm.script(
            Reply(
                tool_calls=[
                    ToolCallSpec("sleep_read", {"seconds": 30}, id="s1"),
                    ToolCallSpec("sleep_read", {"seconds": 30}, id="s2"),
                ]
            )
        )
    messages = history()
    started = asyncio.Event()

    def sink(event: LoopEvent) -> None:
        if isinstance(event, TextDelta | ToolStarted):
            started.set()

    task = asyncio.create_task(
        run_loop(messages, provider_for(fake_llm), executor(sleeper), ctx=RunContext(sink=sink))
    )
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done
    assert task.cancelled()
    if phase == "stream":
        await fake_llm.wait_for_disconnects(1, timeout=2)
        assert [m.role for m in messages] == ["system", "user"]
    else:
        assert sleeper.cancelled == 2  # the running read tools were interrupted at once
        results = [m for m in messages if m.role == "tool"]
        assert [(m.tool_call_id, m.content) for m in results] == [
            ("s1", CANCELLED_RESULT),
            ("s2", CANCELLED_RESULT),
        ]


async def test_cancel_gives_write_tool_grace_to_finish(fake_llm: FakeLLM) -> None:
    writer = SleepTool("slow_write", "write")
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("slow_write", {"seconds": 0.2}, id="w1"),
                ToolCallSpec("slow_write", {"seconds": 0.2}, id="w2"),
            ]
        )
    )
    messages = history()
    task = asyncio.create_task(
        run_loop(
            messages, provider_for(fake_llm), executor(writer), config=LoopConfig(cancel_grace=2.0)
        )
    )
    await asyncio.wait_for(writer.started.wait(), 5)
    task.cancel()
    await asyncio.wait({task}, timeout=3)
    assert task.cancelled()
    results = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    # The running write finished within the grace; the one not yet started was cancelled.
    assert results == {"w1": "slept 0.2", "w2": CANCELLED_RESULT}
    assert writer.cancelled == 0


async def test_read_tools_of_one_turn_run_concurrently_results_in_order(
    fake_llm: FakeLLM,
) -> None:
    sleeper = SleepTool("sleep_read", "read")
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("sleep_read", {"seconds": 0.3}, id="slow"),
                ToolCallSpec("sleep_read", {"seconds": 0.05}, id="fast"),
            ]
        ),
        Reply(text="ok"),
    )
    messages = history()
    events: list[LoopEvent] = []
    await run_loop(
        messages, provider_for(fake_llm), executor(sleeper), ctx=RunContext(sink=events.append)
    )
    (_s1, e1), (s2, _e2) = sorted(sleeper.spans)
    assert s2 < e1  # overlapped
    finished = [e.call.id for e in events if isinstance(e, ToolFinished)]
    assert finished == ["fast", "slow"]
    assert [m.tool_call_id for m in messages if m.role == "tool"] == ["slow", "fast"]


async def test_write_tools_run_one_at_a_time(fake_llm: FakeLLM) -> None:
    writer = SleepTool("slow_write", "write")
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("slow_write", {"seconds": 0.1}),
                ToolCallSpec("slow_write", {"seconds": 0.1}),
            ]
        ),
        Reply(text="ok"),
    )
    await run_loop(history(), provider_for(fake_llm), executor(writer))
    (_s1, e1), (s2, _e2) = writer.spans
    assert s2 >= e1


async def test_two_empty_turns_end_the_loop(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="  "), Reply(text=""))
    messages = history()
    outcome = await run_loop(messages, provider_for(fake_llm), executor())
    assert outcome.reason == "empty_turns"
    assert outcome.text == EMPTY_TURNS_TEXT
    assert [m.role for m in messages] == ["system", "user"]


async def test_one_empty_turn_is_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text=""), Reply(text="Now with content."))
    outcome = await run_loop(history(), provider_for(fake_llm), executor())
    assert outcome.reason == "final"
    assert outcome.text == "Now with content."


@pytest.mark.parametrize("kind", KINDS)
async def test_reasoning_is_an_event_never_the_answer(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(reasoning="Let me think about it.", text="42"))
    events: list[LoopEvent] = []
    messages = history()
    outcome = await run_loop(
        messages, provider_for(fake_llm, kind), executor(), ctx=RunContext(sink=events.append)
    )
    assert outcome.text == "42"
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "Let me think about it."
    assert messages[-1].reasoning == "Let me think about it."


async def test_malformed_tool_arguments_go_back_as_validation_error(fake_llm: FakeLLM) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("echo", '{"text": "unterminated', id="bad")]),
        Reply(tool_calls=[ToolCallSpec("echo", {"wrong": 1}, id="bad2")]),
        Reply(text="fixed"),
    )
    messages = history()
    await run_loop(messages, provider_for(fake_llm), executor(EchoTool()))
    bad, bad2 = (m for m in messages if m.role == "tool")
    assert bad.is_error
    assert "not valid JSON" in bad.content
    assert bad2.is_error
    assert "text" in bad2.content
    assert "Field required" in bad2.content
    # The malformed call is still sent back verbatim so the model sees what it sent.
    sent = fake_llm.requests[1].json["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert sent == '{"text": "unterminated'


async def test_usage_is_recorded_and_estimated_when_missing(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="hi", usage=(120, 7)))
    outcome = await run_loop(history(), provider_for(fake_llm), executor())
    assert (outcome.input_tokens, outcome.output_tokens) == (120, 7)
    for kind in ("openai_chat", "openai_responses"):
        fake_llm.script(Reply(text="hi", omit_usage=True))
        events: list[LoopEvent] = []
        outcome = await run_loop(
            history("count me"),
            provider_for(fake_llm, kind),
            executor(),
            ctx=RunContext(sink=events.append),
        )
        assert not any(isinstance(e, Usage) for e in events)  # the server sent none
        assert outcome.input_tokens >= 4
        assert outcome.output_tokens >= 1


async def test_tool_schema_sent_equals_validation_model(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="ok"))
    tool = EchoTool()
    await run_loop(history(), provider_for(fake_llm), executor(tool))
    [sent] = fake_llm.requests[0].json["tools"]
    assert sent["function"]["parameters"] == tool.schema()
    assert json.loads(json.dumps(tool.schema()))["required"] == ["text"]


async def test_unknown_tool_goes_back_as_error_result(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("nope", {}, id="u1")]), Reply(text="sorry"))
    messages = history()
    outcome = await run_loop(messages, provider_for(fake_llm), executor(EchoTool()))
    assert outcome.text == "sorry"
    [result] = [m for m in messages if m.role == "tool"]
    assert result.is_error
    assert "unknown tool `nope`" in result.content
    assert "echo" in result.content
