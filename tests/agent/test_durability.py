"""Checkpoints, the idempotency envelope, resume and reconcile (docs/durability.md), in process.

A crash is simulated by what it leaves in the store: a run still `running`, the history
persisted up to the assistant's tool calls, and tool call rows started (and maybe
completed). The subprocess test in tests/test_cli_durable.py kills a real process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core.agent.turn import RESTARTING_TEXT
from core.context.transcript import is_valid
from core.messages import Message, ToolCall
from core.store import Checkpoint
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

KEY = ("test", "c1", "")
CONV = "test:c1:"


async def _crash_after_tool_calls(
    fake_llm: FakeLLM, tmp_path: Path, calls: list[ToolCall], rows: list[tuple[str, bool, bool]]
) -> str:
    """Leave the store as a process killed mid-run would: returns the run id.

    rows: (call id, idempotent, completed) for each tool call that had started."""
    async with running_agent(fake_llm, tmp_path) as agent:
        lane = await agent.lane(KEY)
        assert lane.conversation is not None
        conversation = lane.conversation
        conversation.refresh_system()
        messages = conversation.messages
        messages.append(Message.user("do the work"))
        messages.append(Message.assistant("", tool_calls=calls))
        store = agent.store
        store.save_messages(CONV, messages)
        run_id = "deadbeef00000001"
        await store.create_run(run_id, CONV, "user")
        store.checkpoint(
            Checkpoint(run_id, 1, "llm", 1, 1, len(messages), conversation.prompt_hash(), (), 0.0)
        )
        for call_id, idempotent, completed in rows:
            call = next(c for c in calls if c.id == call_id)
            store.tool_started(run_id, call.id, call.name, call.arguments, idempotent)
            if completed:
                store.tool_completed(run_id, call.id, f"stored result of {call_id}", False)
        await store.flush()
        # Dropping the lane without a shutdown path that touches the run = a crash.
        agent.lanes.clear()
    return run_id


async def test_resume_replays_completed_and_reruns_idempotent_calls(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    marker = tmp_path / "workspace" / "side-effect.txt"
    calls = [
        ToolCall(
            id="c_write", name="write_file", arguments='{"path": "side-effect.txt", "content": "x"}'
        ),
        ToolCall(id="c_list", name="list_directory", arguments='{"path": "."}'),
    ]
    run_id = await _crash_after_tool_calls(
        fake_llm, tmp_path, calls, [("c_write", False, True), ("c_list", True, False)]
    )
    fake_llm.script(Reply(text="all done"))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        assert await agent.reconcile() == [run_id]
        assert "/resume" in chat.sent[0]
        assert (await agent.store.run(run_id)).state == "timed_out"  # type: ignore[union-attr]
        await agent.submit(inbound("/resume"), chat)
        await agent.wait_idle()
        assert chat.finals == ["all done"]
        # write_file completed before the crash: replayed from the store, not run again.
        assert not marker.exists()
        sent = fake_llm.requests[-1].json["messages"]
        results = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
        assert results["c_write"] == "stored result of c_write"
        assert "stored result" not in results["c_list"]  # re-run for real
        run = await agent.store.run(run_id)
        assert run is not None
        assert run.state == "completed"


async def test_half_run_non_idempotent_tool_halts_to_waiting_on_human(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    calls = [ToolCall(id="c_bash", name="bash", arguments='{"command": "echo hi >> log"}')]
    run_id = await _crash_after_tool_calls(fake_llm, tmp_path, calls, [("c_bash", False, False)])
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        await agent.reconcile()
        await agent.submit(inbound("/resume"), chat)
        await agent.wait_idle()
        reply = await chat.wait_sent("can't safely resume")
        assert "`bash`" in reply
        assert fake_llm.requests == []  # nothing was sent to the model, nothing re-run
        run = await agent.store.run(run_id)
        assert run is not None
        assert run.state == "waiting_on_human"
        assert not run.resumable
        lane = await agent.lane(KEY)
        assert lane.conversation is not None
        assert is_valid(lane.conversation.messages)
        events = [name for _, name, _, _ in await agent.store.events(run_id)]
        assert "agent_run.resume_unsafe" in events


async def test_prompt_hash_drift_halts_resume(fake_llm: FakeLLM, tmp_path: Path) -> None:
    calls = [ToolCall(id="c_list", name="list_directory", arguments='{"path": "."}')]
    run_id = await _crash_after_tool_calls(fake_llm, tmp_path, calls, [])
    chat = RecordingResponder()
    changed = {"agent": {"system_prompt": "You are a different bot now."}}
    async with running_agent(fake_llm, tmp_path, **changed) as agent:
        await agent.reconcile()
        await agent.submit(inbound("/resume"), chat)
        reply = await chat.wait_sent("can't safely resume")
        assert "configuration or the tools changed" in reply
        run = await agent.store.run(run_id)
        assert run is not None
        assert run.state == "waiting_on_human"
        assert fake_llm.requests == []


async def test_new_message_instead_of_resume_closes_the_interrupted_calls(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    calls = [ToolCall(id="c_bash", name="bash", arguments='{"command": "touch made"}')]
    await _crash_after_tool_calls(fake_llm, tmp_path, calls, [("c_bash", False, False)])
    fake_llm.script(Reply(text="ok, moving on"))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.reconcile()
        await agent.submit(inbound("never mind, something else"), chat)
        await agent.wait_idle()
        assert chat.finals == ["ok, moving on"]
        assert not (tmp_path / "workspace" / "made").exists()
        await agent.submit(inbound("/resume"), chat)
        assert "no interrupted run" in await chat.wait_sent("no interrupted run")


async def test_tool_calls_are_recorded_started_then_completed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."}, id="c1")]),
        Reply(text="done"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        before = time.time()
        await agent.submit(inbound("list"), chat)
        await agent.wait_idle()
        run = (await agent.store.runs(conv=CONV))[0]
        row = (await agent.store.tool_calls(run.id))["c1"]
        assert row.idempotent
        assert row.completed
        assert before <= row.started_at <= row.completed_at
        checkpoint = await agent.store.last_checkpoint(run.id)
        assert checkpoint is not None
        assert checkpoint.kind == "final"
        rows = await agent.store._all(
            "SELECT kind FROM checkpoints WHERE run_id = ? ORDER BY seq", (run.id,)
        )
        # input persisted, the tool-calling response, the tool result, the final answer.
        assert [r[0] for r in rows] == ["input", "llm", "tool", "final"]


async def test_session_snapshot_is_restored_after_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="I will remember", usage=(100, 7)), Reply(text="you said hello"))
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("hello"), RecordingResponder())
        await agent.wait_idle()
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/status"), chat)
        status = chat.sent[0]
        assert "100 in, 7 out" in status
        await agent.submit(inbound("what did I say?"), chat)
        await agent.wait_idle()
        sent = fake_llm.requests[-1].json["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["hello", "what did I say?"]


async def test_queued_messages_survive_a_restart(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="answer one", chunk_delay=0.05), Reply(text="answer two"))
    first = RecordingResponder()
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("one"), first)
        await agent.submit(inbound("two"), first)
        await fake_llm.wait_for_requests(1)
    # The shutdown let "one" finish; "two" was still queued and is stored as such.
    assert first.finals == ["answer one"]
    later = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, responders=lambda key: later) as agent:
        await agent.reconcile()
        await agent.wait_idle()
        assert later.finals == ["answer two"]
        sent = fake_llm.requests[-1].json["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == ["one", "two"]
        runs = await agent.store.runs(conv=CONV)
        assert [r.state for r in runs] == ["completed", "completed"]


async def test_a_run_claimed_but_never_begun_is_queued_again_after_a_crash(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="answered after all"))
    async with running_agent(fake_llm, tmp_path) as agent:
        store = agent.store
        await store.create_run("claimed0000001", CONV, "user", state="queued", text="hello")
        claimed = await store.claim_queued_run(None)  # the crash came right after the claim
        assert claimed is not None
        assert claimed.id == "claimed0000001"
    answered = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, responders=lambda key: answered) as agent:
        assert await agent.reconcile() == []  # nothing interrupted: nothing had begun
        await agent.wait_idle()
        run = await agent.store.run("claimed0000001")
        assert run is not None
        assert run.state == "completed"
    assert answered.finals == ["answered after all"]
    assert not any("interrupted" in text for text in answered.sent)


async def test_a_turn_cut_off_by_shutdown_is_resumable(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="slow " * 400, chunk_size=4, chunk_delay=0.05))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, shutdown_grace=0.2) as agent:
        await agent.submit(inbound("long job"), chat)
        await fake_llm.wait_for_requests(1)
    assert chat.finals == [RESTARTING_TEXT]
    fake_llm.script(Reply(text="resumed and done"))
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.reconcile()
        run = (await agent.store.runs(conv=CONV))[0]
        assert run.state == "timed_out"
        assert run.resumable
        await agent.submit(inbound("/resume"), chat)
        await agent.wait_idle()
        assert chat.finals[-1] == "resumed and done"


@pytest.mark.parametrize("scope", ["channel", "conversation"])
async def test_a_run_in_a_scoped_workspace_resumes_after_a_restart(
    fake_llm: FakeLLM, tmp_path: Path, scope: str
) -> None:
    """The system message names the channel's (or conversation's) workspace: a run resumed
    before any new turn must hash the same prompt, not the workspace root's."""
    fake_llm.script(Reply(text="slow " * 400, chunk_size=4, chunk_delay=0.05))
    chat = RecordingResponder()
    scoped = {"tools": {"workspace_scope": scope}}
    async with running_agent(fake_llm, tmp_path, shutdown_grace=0.2, **scoped) as agent:
        await agent.submit(inbound("long job"), chat)
        await fake_llm.wait_for_requests(1)
    fake_llm.script(Reply(text="resumed and done"))
    async with running_agent(fake_llm, tmp_path, **scoped) as agent:
        await agent.reconcile()
        await agent.submit(inbound("/resume"), chat)
        await agent.wait_idle()
        assert chat.finals[-1] == "resumed and done"
