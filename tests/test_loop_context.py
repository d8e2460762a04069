"""Context management inside real runs: compaction before a call, and one compact-and-retry
when the provider itself says the prompt is too long (docs/context.md)."""

from __future__ import annotations

import pytest

from core.context.manager import ContextManager, ContextSettings
from core.context.summarize import provider_summarizer
from core.context.tokens import TokenCounter
from core.errors import ContextLengthError
from core.events import LoopEvent, Observed
from core.loop import Guards, run_loop
from core.messages import Message, ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, Fault, Reply
from tests.helpers import EchoTool


def executor() -> ToolExecutor:
    return ToolExecutor(ToolRegistry([EchoTool()]), ToolPolicy(), ToolContext(SandboxSettings()))


def long_history(turns: int) -> list[Message]:
    messages = [Message.system("You are a test.")]
    for n in range(turns):
        call = ToolCall(id=f"c{n}", name="echo", arguments='{"text": "x"}')
        messages += [
            Message.user(f"request {n}: " + "please look at this " * 50),
            Message.assistant("", (call,)),
            Message.tool_result(call, f"echo: result {n}"),
            Message.assistant(f"answer {n}"),
        ]
    messages.append(Message.user("the latest request, kept word for word"))
    return messages


async def test_compaction_fires_before_the_call_and_the_run_goes_on(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(text="SUMMARY: earlier requests 0-9 were answered."), Reply(text="done"))
    provider = provider_for(fake_llm)
    counter = TokenCounter()
    messages = long_history(10)
    window = 2400
    assert counter.messages(messages) > 0.7 * window
    context = ContextManager(window, counter, provider_summarizer(provider), ContextSettings())
    events: list[LoopEvent] = []
    outcome = await run_loop(
        messages,
        provider,
        executor(),
        ctx=RunContext(sink=events.append),
        guards=Guards(context=context),
    )
    assert outcome.text == "done"
    main_call = fake_llm.requests[1].json["messages"]
    texts = [m["content"] for m in main_call if m["role"] == "user"]
    assert any("SUMMARY: earlier requests" in t for t in texts)
    assert texts[-1] == "the latest request, kept word for word"
    assert counter.messages(messages[:-1]) < 0.7 * window
    names = [e.name for e in events if isinstance(e, Observed)]
    assert "agent.compaction.run" in names
    assert "agent.recovery.fired" in names


async def test_provider_context_length_error_compacts_and_retries_once(fake_llm: FakeLLM) -> None:
    too_long = Fault(status=400, message="This model's maximum context length is 4000 tokens")
    fake_llm.script(Reply(fault=too_long), Reply(text="fits now"))
    provider = provider_for(fake_llm)
    counter = TokenCounter()
    messages = long_history(6)
    before = counter.messages(messages)
    # The window is configured too large, so our own estimate did not see the problem.
    context = ContextManager(100_000, counter, None, ContextSettings())
    outcome = await run_loop(messages, provider, executor(), guards=Guards(context=context))
    assert outcome.text == "fits now"
    assert len(fake_llm.requests) == 2
    assert counter.messages(messages) < before


async def test_a_second_context_length_error_is_raised(fake_llm: FakeLLM) -> None:
    too_long = Fault(status=400, message="prompt is too long")
    fake_llm.script(Reply(fault=too_long), Reply(fault=too_long))
    context = ContextManager(100_000, TokenCounter(), None, ContextSettings())
    with pytest.raises(ContextLengthError):
        await run_loop(
            long_history(3), provider_for(fake_llm), executor(), guards=Guards(context=context)
        )
    assert len(fake_llm.requests) == 2
