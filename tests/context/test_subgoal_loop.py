"""The `subgoal` strategy in a real run over HTTP: extraction, summary and the agent's own
calls all go to the fake LLM, which rejects any history with an orphaned tool result or an
unanswered call; compaction fires mid-run and the step in progress survives it."""

from __future__ import annotations

import json

from pydantic import BaseModel

from core.context.manager import SUMMARY_HEADER, ContextManager, ContextSettings
from core.context.subgoals import SUBGOAL_PROMPT
from core.context.summarize import SUMMARY_PROMPT, provider_summarizer
from core.context.tokens import TokenCounter
from core.loop import Guards, LoopConfig, run_loop
from core.messages import Message
from core.sandbox.settings import SandboxSettings
from core.tools.base import Category, Tool, ToolContext, ToolRegistry, ToolResult
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec
from tests.helpers import EchoArgs

STEPS = 12


class DumpTool(Tool):
    """A read tool with a small call; a big output (~600 tokens) in the compare phase."""

    name: str = "dump"
    description: str = "Dump a data set."
    category: Category = "read"
    params = EchoArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, EchoArgs)
        size = 150 if args.text.startswith("compare") else 10
        return ToolResult(" ".join(f"{args.text}-{i}" for i in range(size)))


EXTRACTION = SUBGOAL_PROMPT.split("{", 1)[0][:40]
SUMMARY = SUMMARY_PROMPT.split("\n", 1)[0][:40]


async def test_a_run_compacts_mid_task_and_every_request_is_valid(fake_llm: FakeLLM) -> None:
    main_calls = 0

    async def answer(request: RecordedRequest) -> Reply:
        nonlocal main_calls
        text = json.dumps(request.json)
        if EXTRACTION in text:
            # Steps 1-6 gather, 7-12 compare: the newest echo in the window tells.
            return Reply(text="SUBGOAL: compare" if "compare" in text else "SUBGOAL: gather")
        if SUMMARY in text:
            return Reply(text="SUMMARY: gathered six things")
        main_calls += 1
        # Deterministic timing: the extraction started before this call is applied before
        # the reply, so the registry is one step behind, as with a real model's latency.
        assert cm.subgoals is not None
        await cm.subgoals.settle()
        if main_calls > STEPS:
            return Reply(text="all compared")
        phase = "gather" if main_calls <= STEPS // 2 else "compare"
        notes = " ".join(f"note{main_calls}-{i}" for i in range(150)) if phase == "gather" else ""
        call = ToolCallSpec("dump", {"text": f"{phase}{main_calls}"})
        return Reply(text=notes, tool_calls=[call])

    fake_llm.responder = answer
    provider = provider_for(fake_llm)
    settings = ContextSettings(strategy="subgoal", keep_tail=4)
    cm = ContextManager(8000, TokenCounter(), provider_summarizer(provider), settings)
    tools = ToolExecutor(ToolRegistry([DumpTool()]), ToolPolicy(), ToolContext(SandboxSettings()))
    messages = [Message.system("You are a test."), Message.user("do the two phases")]
    outcome = await run_loop(
        messages, provider, tools, config=LoopConfig(max_iterations=20), guards=Guards(context=cm)
    )
    assert cm.subgoals is not None
    await cm.subgoals.settle()
    assert outcome.text == "all compared"
    assert [r.error for r in fake_llm.requests] == [None] * len(fake_llm.requests)
    assert messages[1].content.startswith(SUMMARY_HEADER)  # it did compact
    assert cm.subgoal_status() == "compare"
    start = cm.subgoals.registry.active_start()
    assert start is not None
    kept = [m.content for m in messages[start:] if m.role == "tool"]
    # The compare phase is the active subgoal: all its outputs are there, word for word
    # (`summary` would have kept only the last keep_tail = 4 messages at R1: one fewer).
    assert sum(c.startswith("compare") for c in kept) == STEPS // 2
    assert all(not c.startswith("[old tool output") for c in kept)
