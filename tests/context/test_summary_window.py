"""The summary model's own window bounds every summary request: a huge tool output must
not make the compaction (or TACO) call overflow a summary model smaller than the main one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from core.context.manager import ContextManager
from core.context.summarize import SUMMARIZER_SYSTEM, clip_to_tokens, provider_summarizer
from core.context.tokens import FRAMING_TOKENS, TokenCounter
from core.messages import Message, ToolCall
from tests.conftest import provider_for
from tests.context import Sink
from tests.fakes.llm import FakeLLM, Reply

KINDS = ["openai_chat", "openai_responses", "anthropic"]
SUMMARY_WINDOW = 6000
SUMMARY_MAX_OUTPUT = 1024
TEXT_KEYS = {"content", "text", "system", "instructions"}


def huge_output(size: int = 600_000) -> str:
    """A dense log (ids, hex, paths): far fewer characters per token than prose."""
    rng = random.Random(7)
    lines, total = [], 0
    while total < size:
        line = (
            f"{rng.randrange(10**9):09d} {rng.getrandbits(64):016x} /srv/app-{rng.randrange(999)}"
            f"/log.{rng.randrange(99)} status={rng.choice(['ok', 'FAIL', 'retry'])}"
        )
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def history_with_a_huge_output() -> list[Message]:
    """The huge result is the newest message before the verbatim tail, so R1 summarises it."""
    call = ToolCall(id="big", name="bash", arguments='{"command": "cat /var/log/all.log"}')
    messages = [
        Message.system("You are a test."),
        Message.user("find the failures in the logs"),
        Message.assistant("", (call,)),
        Message.tool_result(call, huge_output()),
    ]
    for n in range(5):  # exactly `keep_tail` (10) messages after the huge result
        messages += [Message.assistant(f"answer {n}"), Message.user(f"follow-up {n}")]
    return messages


def request_tokens(body: Any, counter: TokenCounter) -> int:
    """Tokens of every text the request carries (system, instructions, message contents)."""
    total = 0
    stack: list[Any] = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in TEXT_KEYS and isinstance(value, str):
                    total += counter.text(value) + FRAMING_TOKENS
                else:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return total


def max_output(body: dict[str, Any]) -> int:
    return int(body.get("max_tokens") or body["max_output_tokens"])


def summary_provider(fake_llm: FakeLLM, kind: str) -> Any:
    return provider_for(
        fake_llm, kind, context_window=SUMMARY_WINDOW, max_output_tokens=SUMMARY_MAX_OUTPUT
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_compaction_summary_request_fits_the_summary_window(
    fake_llm: FakeLLM, kind: str
) -> None:
    fake_llm.script(Reply(text="SUMMARY: the logs show three failures"))
    counter = TokenCounter()
    summarizer = provider_summarizer(summary_provider(fake_llm, kind))
    context = ContextManager(400_000, counter, summarizer)  # the main model's window is big
    messages = history_with_a_huge_output()
    report = await context.compact(messages, sink=Sink())
    assert report.summary == "llm"
    [request] = fake_llm.requests
    assert request.error is None
    assert SUMMARIZER_SYSTEM in str(request.json)
    used = request_tokens(request.json, counter)
    assert used + max_output(request.json) <= SUMMARY_WINDOW
    assert used > (SUMMARY_WINDOW - SUMMARY_MAX_OUTPUT) // 2  # clipped, not emptied
    prompt = str(request.json)
    assert "Summarise this earlier part of a conversation" in prompt  # instructions kept
    assert "</conversation>" in prompt
    assert "status=" in prompt  # the huge output itself was summarised, clipped
    fake_llm.assert_complete()


@pytest.mark.parametrize("kind", KINDS)
async def test_taco_request_fits_the_summary_window(fake_llm: FakeLLM, kind: str) -> None:
    fake_llm.script(Reply(text="3 FAIL lines in /srv/app-1/log.2"))
    counter = TokenCounter()
    summarizer = provider_summarizer(summary_provider(fake_llm, kind))
    context = ContextManager(400_000, counter, summarizer)
    call = ToolCall(id="big", name="bash", arguments="{}")
    result = await context.process_tool_result(
        Message.tool_result(call, huge_output()), approved=False
    )
    assert "3 FAIL lines" in result.content
    [request] = fake_llm.requests
    assert request_tokens(request.json, counter) + max_output(request.json) <= SUMMARY_WINDOW


def test_clip_to_tokens_keeps_both_ends_and_fits() -> None:
    counter = TokenCounter()
    text = "START " + huge_output(200_000) + " END"
    clipped = clip_to_tokens(text, 3000, counter)
    assert counter.text(clipped) <= 3000
    assert counter.text(clipped) > 2000
    assert clipped.startswith("START ")
    assert clipped.endswith(" END")
    assert "characters cut to fit" in clipped
    assert clip_to_tokens("short text", 3000, counter) == "short text"
