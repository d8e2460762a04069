"""`ScriptedProvider` drives the real tool loop (and the real agent) without HTTP: a text
answer, a tool-call round trip, errors, retries, and a script that must be played out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.app import App, build_registry
from core.errors import ProviderAuthError, ProviderRateLimited, ProviderUnavailable
from core.events import LoopEvent, StreamRestarted, TextDelta, ToolFinished, Usage
from core.loop import run_loop
from core.messages import Message
from core.providers import Provider
from core.providers.scripted import ScriptedProvider, ScriptedReply, tool_call
from core.run_context import RunContext
from core.tools.base import SandboxSettings, ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.agentkit import RecordingResponder, agent_config, inbound
from tests.fakes.clock import FakeClock
from tests.helpers import EchoTool


def executor(*tools: object) -> ToolExecutor:
    return ToolExecutor(
        ToolRegistry(tools),  # type: ignore[arg-type]
        ToolPolicy(),
        ToolContext(sandbox=SandboxSettings()),
    )


def history(text: str = "hello") -> list[Message]:
    return [Message.system("You are a test."), Message.user(text)]


async def test_a_text_answer_ends_the_turn() -> None:
    provider = ScriptedProvider([ScriptedReply("Hello there, human.", usage=Usage(30, 5))])
    events: list[LoopEvent] = []
    messages = history()
    outcome = await run_loop(messages, provider, executor(), RunContext(sink=events.append))
    assert (outcome.reason, outcome.text, outcome.iterations) == ("final", "Hello there, human.", 1)
    assert (outcome.input_tokens, outcome.output_tokens) == (30, 5)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello there, human."
    assert messages[-1] == Message.assistant("Hello there, human.")
    [request] = provider.requests
    assert request.messages == tuple(history())
    assert request.tool_names == []
    provider.assert_complete()


async def test_a_tool_call_round_trip() -> None:
    call = tool_call("echo", {"text": "ping"}, id="c1")
    provider = ScriptedProvider(
        [ScriptedReply("Let me check.", tool_calls=[call]), ScriptedReply("It said ping.")]
    )
    events: list[LoopEvent] = []
    outcome = await run_loop(
        history(), provider, executor(EchoTool()), RunContext(sink=events.append)
    )
    assert (outcome.reason, outcome.text, outcome.iterations) == ("final", "It said ping.", 2)
    assert outcome.tool_calls == 1
    first, second = provider.requests
    assert first.tool_names == ["echo"]
    assistant, result = second.messages[-2:]
    assert (assistant.content, assistant.tool_calls) == ("Let me check.", (call,))
    assert (result.role, result.tool_call_id, result.content) == ("tool", "c1", "echo: ping")
    assert [e.call.id for e in events if isinstance(e, ToolFinished)] == ["c1"]
    provider.assert_complete()


async def test_an_error_reaches_the_caller_as_the_provider_raises_it() -> None:
    limited = ProviderRateLimited("HTTP 429: slow down", status=429, retry_after=30)
    provider = ScriptedProvider([limited])
    messages = history()
    with pytest.raises(ProviderRateLimited) as info:
        await run_loop(messages, provider, executor())
    assert info.value is limited
    assert messages == history()  # nothing half-written into the transcript
    provider.assert_complete()


async def test_an_error_after_a_tool_call_leaves_the_results_in_place() -> None:
    provider = ScriptedProvider(
        [
            ScriptedReply(tool_calls=[tool_call("echo", {"text": "x"}, id="c1")]),
            ProviderAuthError("HTTP 401: bad key", status=401),
        ]
    )
    messages = history()
    with pytest.raises(ProviderAuthError):
        await run_loop(messages, provider, executor(EchoTool()))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    provider.assert_complete()


async def test_retryable_errors_are_retried_when_asked() -> None:
    clock = FakeClock()
    provider = ScriptedProvider(
        [ProviderUnavailable("HTTP 503: busy", retry_after=2), ScriptedReply("second try")],
        max_retries=1,
        clock=clock,
    )
    events: list[LoopEvent] = []
    outcome = await run_loop(history(), provider, executor(), RunContext(sink=events.append))
    assert outcome.text == "second try"
    [restarted] = [e for e in events if isinstance(e, StreamRestarted)]
    assert (restarted.attempt, restarted.discard) == (1, False)
    assert "busy" in restarted.reason
    assert len(clock.sleeps) == 1
    assert 2 <= clock.sleeps[0] < 2.2
    assert len(provider.requests) == 2


def test_assert_complete_names_what_was_never_played() -> None:
    provider = ScriptedProvider([ScriptedReply("unused")])
    with pytest.raises(AssertionError, match="1 scripted step"):
        provider.assert_complete()


async def test_a_call_past_the_end_of_the_script_fails_loudly() -> None:
    provider = ScriptedProvider([ScriptedReply(tool_calls=[tool_call("echo", {"text": "x"})])])
    with pytest.raises(AssertionError, match="script is played out"):
        await run_loop(history(), provider, executor(EchoTool()))
    assert len(provider.requests) == 2


async def test_stream_is_assembled_like_a_real_one() -> None:
    provider = ScriptedProvider(
        [
            ScriptedReply(
                ["Two ", "chunks."],
                reasoning="thinking",
                tool_calls=[tool_call("a", '{"k": 1}', id="x"), tool_call("b")],
            )
        ]
    )
    done = await provider.complete(history())
    assert done.message.content == "Two chunks."
    assert done.message.reasoning == "thinking"
    assert [(c.id, c.name, c.arguments) for c in done.message.tool_calls] == [
        ("x", "a", '{"k": 1}'),
        (done.message.tool_calls[1].id, "b", "{}"),
    ]
    assert (done.stop_reason, done.usage) == ("tool_calls", None)


async def test_the_durable_agent_runs_on_a_scripted_provider(tmp_path: Path) -> None:
    """Agent-level tests need no HTTP: the app's provider is simply the scripted one."""
    unused = SimpleNamespace(base_url="http://127.0.0.1:9/v1")  # never contacted
    cfg = agent_config(unused, tmp_path)  # type: ignore[arg-type]
    app = App(cfg, {}, build_registry(cfg, {}))
    scripted = ScriptedProvider([ScriptedReply("Hi from the script.")])
    provider: Provider = scripted  # it is a Provider
    app.providers["fake"] = provider
    agent = await app.open_agent()
    try:
        chat = RecordingResponder()
        await agent.submit(inbound("hello"), chat)
        await agent.wait_idle()
        assert chat.finals == ["Hi from the script."]
        last = scripted.requests[0].messages[-1]
        assert (last.role, last.content.endswith("hello")) == ("user", True)
        scripted.assert_complete()
    finally:
        await app.close_agent(agent, grace=5.0)
        await app.aclose()
    assert scripted.closed
