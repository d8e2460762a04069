"""Regressions found in review: reconcile against live traffic, concurrent redelivery,
replay of a repeated call id, /compact racing a message, input during shutdown, and a
shutdown-cut side effect on resume."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.agent.runs import RunRecorder
from core.messages import ToolCall
from core.store import open_store
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

CONV = "test:c1:"


async def test_reconcile_leaves_this_process_runs_alone(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="live " * 100, chunk_size=5, chunk_delay=0.02))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        await agent.submit(inbound("a message that arrived before reconcile"), chat)
        await fake_llm.wait_for_requests(1)
        assert await agent.reconcile() == []
        await agent.wait_idle()
        assert chat.sent == []  # no false "I was interrupted"
        assert chat.finals == ["live " * 100]
        assert [r.state for r in await agent.store.runs()] == ["completed"]


async def test_concurrent_redeliveries_are_taken_in_once(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="once"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        results = await asyncio.gather(
            *(agent.submit(inbound("hi", event_id="ev7"), chat) for _ in range(3))
        )
        await agent.wait_idle()
        assert sorted(results) == [False, False, True]
        assert chat.finals == ["once"]


async def test_replay_needs_the_same_call_not_just_the_same_id(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "parley.db")
    try:
        store.tool_started("r1", "call_0", "list_directory", '{"path": "."}', True)
        store.tool_completed("r1", "call_0", "a.txt b.txt", False)
        await store.flush()
        # An earlier iteration's call_0 completed; the open call_0 is a different call.
        recorder = RunRecorder(store, CONV, "r1", "hash", replayable={"call_0"})
        write = ToolCall(id="call_0", name="write_file", arguments='{"path": "x"}')
        assert await recorder.begin(write, idempotent=False) is None
        again = RunRecorder(store, CONV, "r1", "hash", replayable={"call_0"})
        listing = ToolCall(id="call_0", name="list_directory", arguments='{"path": "."}')
        store.tool_started("r1", "call_0", "list_directory", '{"path": "."}', True)
        store.tool_completed("r1", "call_0", "a.txt b.txt", False)
        await store.flush()
        replayed = await again.begin(listing, idempotent=True)
        assert replayed is not None
        assert replayed.content == "a.txt b.txt"
        # Only once: a later iteration reusing the id runs for real.
        assert await again.begin(listing, idempotent=True) is None
    finally:
        await store.aclose()


async def test_a_message_during_compact_is_not_lost(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(*(Reply(text=f"answer {i} " + "words " * 60) for i in range(12)))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        for i in range(12):
            await agent.submit(inbound(f"question {i}"), chat)
        await agent.wait_idle()
        slow_summary = asyncio.Event()

        async def summarise(request):  # type: ignore[no-untyped-def]
            if request.json["messages"][-1]["content"].startswith("late question"):
                return Reply(text="late answer")
            await slow_summary.wait()
            return Reply(text="Summary of the talk.")

        fake_llm.responder = summarise
        compacting = asyncio.create_task(agent.submit(inbound("/compact"), chat))
        await fake_llm.wait_for_requests(13)  # the summary call is in flight
        await agent.submit(inbound("late question"), chat)
        slow_summary.set()
        await compacting
        await agent.wait_idle()
        assert chat.finals[-1] == "late answer"
        lane = await agent.lane(("test", "c1", ""))
        assert lane.conversation is not None
        contents = [m.content for m in lane.conversation.messages]
        assert "late question" in contents
        assert "late answer" in contents
        stored = [m.content for m in await agent.store.load_messages(CONV)]
        assert stored == contents


async def test_input_during_shutdown_is_turned_away_cleanly(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="slow " * 100, chunk_size=5, chunk_delay=0.02))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("first"), chat)
        await fake_llm.wait_for_requests(1)
        stopping = asyncio.create_task(agent.shutdown(grace=5))
        await asyncio.sleep(0)
        assert await agent.submit(inbound("too late", key=("test", "new", ""), event_id="e1"), chat)
        await stopping
        assert "restarting" in chat.sent[-1]
        assert not await agent.store.seen("test", "e1")  # a redelivery will be answered


async def test_resume_after_shutdown_halts_on_a_cut_side_effect(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 5; touch done"})]))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, shutdown_grace=0.2) as agent:
        await agent.submit(inbound("do it"), chat)
        lane = await agent.lane(("test", "c1", ""))
        async with asyncio.timeout(10):
            while not lane.run_id or not await agent.store.tool_calls(lane.run_id):
                await asyncio.sleep(0.02)
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.reconcile()
        await agent.submit(inbound("/resume"), chat)
        reply = await chat.wait_sent("can't safely resume")
        assert "`bash`" in reply
        assert len(fake_llm.requests) == 1
        lane = await agent.lane(("test", "c1", ""))
        assert lane.conversation is not None
        results = [m.content for m in lane.conversation.messages if m.role == "tool"]
        assert results == [
            "interrupted by a restart: this call may or may not have taken effect; "
            "it was not run again"
        ]
