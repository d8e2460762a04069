"""Lanes (docs/durability.md): order within a conversation, concurrency across
conversations, /stop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from core.context.transcript import is_valid
from core.store import SharedStore
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec


async def test_two_messages_in_one_lane_are_answered_in_order(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="first answer", chunk_delay=0.01), Reply(text="second answer"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("one"), chat)
        await agent.submit(inbound("two"), chat)
        await agent.wait_idle()
        assert chat.finals == ["first answer", "second answer"]
        # The second request carried the first exchange: it ran after the first finished.
        second = fake_llm.requests[1].json["messages"]
        assert [m["content"] for m in second if m["role"] != "system"] == [
            "one",
            "first answer",
            "two",
        ]


async def test_two_lanes_overlap_in_time(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(text="a" * 40, chunk_size=4, chunk_delay=0.05),
        Reply(text="b" * 40, chunk_size=4, chunk_delay=0.05),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        first, second = RecordingResponder(), RecordingResponder()
        await agent.submit(inbound("x", key=("test", "c1", "")), first)
        await agent.submit(inbound("y", key=("test", "c2", "")), second)
        await fake_llm.wait_for_requests(2)
        # Both requests arrived before either stream finished: the lanes ran concurrently.
        assert first.streams[0].final is None
        assert second.streams[0].final is None
        await agent.wait_idle()
        assert sorted(first.finals + second.finals) == ["a" * 40, "b" * 40]


async def _stop_after(agent, chat, started) -> float:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):  # a regression fails here instead of hanging
        await started()
    t0 = time.monotonic()
    await agent.submit(inbound("/stop"), chat)
    await agent.wait_idle()
    return time.monotonic() - t0


async def test_stop_while_streaming_leaves_a_valid_transcript(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="word " * 400, chunk_size=5, chunk_delay=0.05))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("talk a lot"), chat)

        async def streaming() -> None:
            while not (chat.streams and chat.streams[0].deltas):
                await asyncio.sleep(0.01)

        elapsed = await _stop_after(agent, chat, streaming)
        assert elapsed < 10.0  # unstopped, it would run for 20 s or more
        assert chat.finals == ["Stopped."]
        lane = agent.lanes[("test", "c1", "")]
        assert lane.last_state == "cancelled"
        assert lane.conversation is not None
        assert is_valid(lane.conversation.messages)
        runs = await agent.store.runs(conv=lane.conv_id)
        assert runs[0].state == "cancelled"


async def test_stop_during_sleep_30_in_bash(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 30"})]))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("wait"), chat)
        lane = await agent.lane(("test", "c1", ""))

        async def in_bash() -> None:
            while not (await agent.store.tool_calls(lane.run_id or "")):
                await asyncio.sleep(0.02)

        elapsed = await _stop_after(agent, chat, in_bash)
        assert elapsed < 10.0  # unstopped, it would run for 20 s or more
        assert lane.conversation is not None
        messages = lane.conversation.messages
        assert is_valid(messages)
        assert messages[-1].role == "tool"
        assert "cancelled" in messages[-1].content


async def test_stop_between_tools(fake_llm: FakeLLM, tmp_path: Path) -> None:
    # The second LLM call is slow: /stop lands after the first tool, before the next call ends.
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})]),
        Reply(text="never " * 200, chunk_size=2, chunk_delay=0.05),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("look"), chat)
        lane = await agent.lane(("test", "c1", ""))

        async def after_tool() -> None:
            await fake_llm.wait_for_requests(2)

        elapsed = await _stop_after(agent, chat, after_tool)
        assert elapsed < 10.0  # unstopped, it would run for 20 s or more
        assert lane.conversation is not None
        assert is_valid(lane.conversation.messages)
        roles = [m.role for m in lane.conversation.messages]
        assert roles == ["system", "user", "assistant", "tool"]


async def test_idle_lanes_beyond_the_limit_are_evicted_and_reload(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="noted"), Reply(text="still here"))
    async with running_agent(fake_llm, tmp_path) as agent:
        agent.max_lanes = 2
        chat = RecordingResponder()
        await agent.submit(inbound("remember me", key=("test", "a", "")), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/status", key=("test", "b", "")), chat)
        await agent.submit(inbound("/status", key=("test", "c", "")), chat)
        assert list(agent.lanes) == [("test", "b", ""), ("test", "c", "")]
        await agent.submit(inbound("and now?", key=("test", "a", "")), chat)
        await agent.wait_idle()
        sent = fake_llm.requests[-1].json["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["remember me", "and now?"]


async def test_the_lane_whose_run_just_ended_is_evicted_last(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Eviction goes by last activity, not by when a lane was first asked for: a lane
    whose answer just went out is the likeliest to hear a follow-up."""
    gate = asyncio.Event()

    async def slow(request: object) -> Reply:
        await gate.wait()
        return Reply(text="done")

    fake_llm.responder = slow
    async with running_agent(fake_llm, tmp_path) as agent:
        agent.max_lanes = 2
        chat = RecordingResponder()
        await agent.submit(inbound("take your time", key=("test", "a", "")), chat)
        await fake_llm.wait_for_requests(1)
        await agent.submit(inbound("/status", key=("test", "b", "")), chat)  # asked for later
        gate.set()
        await agent.wait_idle()  # a's run ends after b was last used
        await agent.submit(inbound("/status", key=("test", "c", "")), chat)
        assert list(agent.lanes) == [("test", "a", ""), ("test", "c", "")]


async def test_stop_drops_queued_messages_for_good(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="long " * 300, chunk_size=3, chunk_delay=0.05))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("first"), chat)
        await agent.submit(inbound("second"), chat)
        await fake_llm.wait_for_requests(1)
        await agent.submit(inbound("/stop"), chat)
        assert chat.sent[-1] == "Dropped 1 queued message."  # the run itself says "Stopped."
        await agent.wait_idle()
        states = sorted(r.state for r in await agent.store.runs())
        assert states == ["cancelled", "cancelled"]
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        await agent.reconcile()
        await agent.wait_idle()
        assert len(fake_llm.requests) == 1  # "second" was not re-queued


async def test_cancel_running_stops_the_run_and_keeps_the_queue(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(text="long " * 300, chunk_size=3, chunk_delay=0.05), Reply(text="second answer")
    )
    key = ("test", "c1", "")
    async with running_agent(fake_llm, tmp_path) as agent:
        assert not await agent.cancel_running(key)  # no lane yet: nothing to cancel
        chat = RecordingResponder()
        await agent.submit(inbound("first"), chat)
        await agent.submit(inbound("second"), chat)
        await fake_llm.wait_for_requests(1)
        assert await agent.cancel_running(key)  # returns once the run has ended
        assert chat.finals == ["Stopped."]
        await agent.wait_idle()
        assert chat.finals == ["Stopped.", "second answer"]  # unlike /stop, the queue stays
        assert not await agent.cancel_running(key)


async def test_a_full_queue_turns_a_message_away_and_says_so(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda _r: Reply(text="answer", chunk_size=2, chunk_delay=0.02)
    async with running_agent(fake_llm, tmp_path, agent={"max_queued": 3}) as agent:
        chat = RecordingResponder()
        for i in range(5):  # one runs, three wait, the fifth is turned away
            await agent.submit(inbound(f"m{i}"), chat)
        text = await chat.wait_sent("did not queue")
        assert "3 messages waiting" in text
        await agent.wait_idle()
        assert chat.finals == ["answer"] * 4
        asked = [m["content"] for r in fake_llm.requests for m in r.json["messages"][-1:]]
        assert "m4" not in asked


async def test_waiting_messages_are_queued_runs_in_the_store_not_in_the_lane(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """One queue (docs/durability.md#the-queue): what waits is a queued run in the store,
    claimed in order by the one dispatcher; an SQLite store has nothing of a shared one."""
    fake_llm.responder = lambda _r: Reply(text="answer", chunk_size=2, chunk_delay=0.02)
    async with running_agent(fake_llm, tmp_path) as agent:
        assert not isinstance(agent.store, SharedStore)
        assert agent.workers is None
        chat = RecordingResponder()
        for i in range(3):
            await agent.submit(inbound(f"m{i}"), chat)
        queued = await agent.store.runs(conv="test:c1:", states=["queued"])
        texts = [r.text for r in reversed(queued)]
        assert texts in (["m1", "m2"], ["m0", "m1", "m2"])  # m0 may be claimed already
        await agent.wait_idle()
        assert chat.finals == ["answer"] * 3
        assert await agent.store.runs(conv="test:c1:", states=["queued"]) == []
        stored = list(reversed(await agent.store.runs(conv="test:c1:")))  # as they came
        started = sorted(stored, key=lambda r: r.started_at or 0.0)
        assert [r.id for r in started] == [r.id for r in stored]
        assert [r.state for r in stored] == ["completed"] * 3
