"""The provider's own "prompt too long", in the shapes real servers send it, makes the loop
compact the history and retry once (docs/context.md): Anthropic's HTTP 400 and the Responses API's
HTTP 400, in-stream `error` event and `response.failed`."""

from __future__ import annotations

from typing import Any

import pytest

from core.context.manager import ContextManager, ContextSettings
from core.context.tokens import TokenCounter
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

ANTHROPIC_400 = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, "
        "decrease input length or `max_tokens` and try again",
    },
}
RESPONSES_ERROR = {
    "message": "Your input exceeds the context window of this model. "
    "Please adjust your input and try again.",
    "type": "invalid_request_error",
    "param": "input",
    "code": "context_length_exceeded",
}

SHAPES: dict[str, tuple[str, Fault]] = {
    "anthropic-http-400": ("anthropic", Fault(status=400, body=ANTHROPIC_400)),
    "responses-http-400": ("openai_responses", Fault(status=400, body={"error": RESPONSES_ERROR})),
    "responses-error-event": ("openai_responses", Fault(stream_error=RESPONSES_ERROR)),
    "responses-failed": (
        "openai_responses",
        Fault(stream_error=RESPONSES_ERROR, stream_error_as="failed"),
    ),
}


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


def sent_size(request: Any) -> int:
    return len(str(request.json))


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_real_overflow_answer_compacts_and_retries(fake_llm: FakeLLM, shape: str) -> None:
    kind, fault = SHAPES[shape]
    fake_llm.script(Reply(text="never sent", fault=fault), Reply(text="fits now"))
    counter = TokenCounter()
    messages = long_history(6)
    before = counter.messages(messages)
    # The window is configured too large, so our own estimate did not see the problem.
    context = ContextManager(100_000, counter, None, ContextSettings())
    events: list[LoopEvent] = []
    outcome = await run_loop(
        messages,
        provider_for(fake_llm, kind),
        executor(),
        ctx=RunContext(sink=events.append),
        guards=Guards(context=context),
    )
    assert outcome.text == "fits now"
    assert len(fake_llm.requests) == 2
    compactions = [
        e.data for e in events if isinstance(e, Observed) and e.name == "agent.compaction.run"
    ]
    assert [d["kind"] for d in compactions] == ["manual"]
    assert counter.messages(messages) < before
    first, retry = fake_llm.requests
    assert sent_size(retry) < sent_size(first)
    assert "the latest request, kept word for word" in str(retry.json)
    fake_llm.assert_complete()
