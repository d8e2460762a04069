"""R1 against the fake LLM server over real HTTP: the summary comes from a provider call,
and the compacted history is then accepted by the fake's strict pairing validation."""

from __future__ import annotations

import pytest

from core.context.manager import SUMMARY_HEADER, ContextManager
from core.context.summarize import SUMMARIZER_SYSTEM, provider_summarizer
from core.errors import ProviderError
from core.messages import Message, ToolCall
from tests.conftest import provider_for
from tests.context import Sink, WordCounter, reply, system, tool_turn, user
from tests.fakes.llm import FakeLLM, Reply

KINDS = ["openai_chat", "openai_responses", "anthropic"]


def long_history() -> list[Message]:
    calls = tuple(ToolCall(id=f"b{i}", name="ls") for i in range(3))
    body = [user(40, "task")]
    body += [m for i in range(10) for m in tool_turn(f"t{i}", "search", 30)]
    body += [Message.assistant("", calls), *(Message.tool_result(c, "ok") for c in calls)]
    body += [reply(20, f"f{i}") for i in range(8)]
    return [system(300), *body]


@pytest.mark.parametrize("kind", KINDS)
async def test_r1_with_a_provider_summary_is_accepted_by_the_fake(
    fake_llm: FakeLLM, kind: str
) -> None:
    provider = provider_for(fake_llm, kind)
    fake_llm.script(Reply(text="SUMMARY: the user wants a search report"), Reply(text="done"))
    cm = ContextManager(1000, WordCounter(), provider_summarizer(provider))
    messages, sink = long_history(), Sink()
    assert await cm.preflight(messages, sink) == "ok"
    assert sink.named("agent.compaction.run")[-1]["summary"] == "llm"
    assert messages[1].content.startswith(SUMMARY_HEADER)
    assert "SUMMARY: the user wants a search report" in messages[1].content
    summary_request = fake_llm.requests[0].json
    assert SUMMARIZER_SYSTEM in str(summary_request)
    assert "TOOL RESULT (search)" in str(summary_request)
    assert messages[2].content.startswith("task task")  # the request itself stays verbatim

    done = await provider.complete(messages)
    assert done.message.content == "done"
    assert [r.error for r in fake_llm.requests] == [None, None]
    fake_llm.assert_complete()


async def test_the_fake_rejects_an_unpaired_history(fake_llm: FakeLLM) -> None:
    """The control: without repair the same kind of history is refused with a 400."""
    provider = provider_for(fake_llm, "openai_chat")
    history = long_history()
    orphaned = [history[0], *history[3:]]  # drop the first call message: its result dangles
    with pytest.raises(ProviderError) as info:
        await provider.complete(orphaned)
    assert info.value.status == 400
