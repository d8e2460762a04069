"""`Agent.run`: a message taken in as `submit` takes it, and its run awaited to its report."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec


async def test_a_run_reports_its_state_text_and_usage(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})]), Reply(text="All done.")
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        report = await agent.run(inbound("look around"), chat)
        assert (report.state, report.text, report.stop_reason) == (
            "completed",
            "All done.",
            "final",
        )
        assert report.iterations == 2  # LLM calls: the tool call, then the answer
        assert report.failure is None
        assert report.input_tokens > 0
        assert report.output_tokens > 0
        assert chat.finals == ["All done."]  # delivered as a submitted message would be
        stored = await agent.store.run(report.run_id)
        assert stored is not None
        assert stored.state == "completed"


async def test_a_failed_run_says_why_in_a_field_not_only_in_its_text(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(fault=Fault(status=401, message="bad key")))
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("hello"))  # nobody watching: a quiet responder
        assert report.state == "failed"
        assert report.failure is not None
        assert "bad key" in report.failure
        assert report.text.startswith("Sorry, that failed: ")


async def test_text_that_starts_no_run_gets_a_report_saying_so(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        report = await agent.run(inbound("/status"), chat)
        assert (report.state, report.stop_reason, report.run_id) == ("cancelled", "command", "")
        assert chat.sent  # the command was answered


async def test_runs_awaited_in_one_conversation_keep_their_order(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="first"), Reply(text="second"))
    async with running_agent(fake_llm, tmp_path) as agent:
        one, two = await asyncio.gather(
            agent.run(inbound("1", event_id="e1")), agent.run(inbound("2", event_id="e2"))
        )
        assert (one.text, two.text) == ("first", "second")
        assert one.run_id < two.run_id
