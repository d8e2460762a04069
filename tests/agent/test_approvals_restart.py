"""Pending approvals survive a restart (docs/tools.md#approvals), in process.

A run waiting on an approver is resumed at start-up by itself and waits again on the same
request: the prompt posted before the restart (no new one), the deadline of the first
request. A click on that prompt answers it, also one that comes before the run is back.
A crash is simulated by what it leaves in the store; tests/channels/test_approvals_restart.py
kills real processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from channels.approvals import TIMED_OUT, Approvals, Resolution
from core.agent import Agent
from core.agent.turn import RESTARTING_APPROVAL_TEXT
from core.chat import ApprovalRequest, PromptRef
from core.messages import Message, ToolCall
from core.store import ApprovalRow, Checkpoint
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

KEY = ("test", "c1", "")
CONV = "test:c1:"
RM = {"command": "rm -rf ./junk"}
SUMMARY = f"bash {json.dumps(RM)}"


@dataclass
class Board:
    """The platform's side: the prompt messages, by id, as people see them."""

    prompts: dict[str, str] = field(default_factory=dict)


@dataclass
class PromptResponder(RecordingResponder):
    """A conversation whose approval prompts work like the adapters' (channels.approvals):
    posted on the `board`, settled by an edit, answered by clicks of approver U1."""

    board: Board = field(default_factory=Board)
    buttons: Approvals = field(default_factory=lambda: Approvals(["U1"]))
    asked: list[ApprovalRequest] = field(default_factory=list)

    async def approve(self, request: ApprovalRequest) -> bool:
        self.asked.append(request)
        self.changed.set()
        return await self.buttons.request(request, self._show, self._settle)

    async def _show(self, request: ApprovalRequest) -> PromptRef:
        message_id = f"m{len(self.board.prompts) + 1}"
        self.board.prompts[message_id] = text = f"Approve {request.summary}?"
        self.changed.set()
        return PromptRef("c1", message_id, text)

    async def _settle(self, request: ApprovalRequest, outcome: str) -> None:
        assert request.prompt is not None
        self.board.prompts[request.prompt.message_id] += f" {outcome}"
        self.changed.set()

    async def click(
        self, agent: Agent, request_id: str, *, allow: bool = True, user: str = "U1"
    ) -> Resolution:
        return await self.buttons.resolve_click(
            request_id, user, "ann", allow, agent=agent, settle=self._settle
        )

    async def wait_asked(self) -> ApprovalRequest:
        await self.until(lambda: bool(self.asked))
        return self.asked[0]

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def junk_dir(tmp_path: Path) -> Path:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    (junk / "old.log").write_text("stale")
    return junk


async def _crash_while_asking(
    fake_llm: FakeLLM, tmp_path: Path, board: Board, *, asked_ago: float, timeout: float = 300.0
) -> tuple[str, str]:
    """Leave the store as a process killed while a run waited on an approver: the run
    `running`, the history up to the bash call, no record of the call starting, and the
    request pending with its prompt on the `board`. Returns (run id, request id)."""
    call = ToolCall(id="c_rm", name="bash", arguments=json.dumps(RM))
    async with running_agent(fake_llm, tmp_path) as agent:
        lane = await agent.lane(KEY)
        assert lane.conversation is not None
        conversation = lane.conversation
        conversation.refresh_system()
        messages = conversation.messages
        messages += [Message.user("clean up"), Message.assistant("", tool_calls=[call])]
        store = agent.store
        store.save_messages(CONV, messages)
        run_id = "deadbeef00000002"
        await store.create_run(run_id, CONV, "user")
        store.checkpoint(
            Checkpoint(run_id, 1, "llm", 1, 1, len(messages), conversation.prompt_hash(), (), 0.0)
        )
        asked = time.time() - asked_ago
        request_id = "a1b2c3d4e5f6"
        await store.request_approval(
            ApprovalRow(
                request_id,
                CONV,
                run_id,
                call.id,
                "bash",
                SUMMARY,
                "destructive",
                "pending",
                asked,
                asked + timeout,
                None,
                None,
                None,
            )
        )
        board.prompts["m1"] = text = f"Approve {SUMMARY}?"
        store.approval_posted(request_id, PromptRef("c1", "m1", text))
        await store.flush()
        agent.lanes.clear()  # no shutdown path touches the run: a crash
    return run_id, request_id


async def _approval_state(agent: Agent, request_id: str) -> str:
    row = await agent.store.approval(request_id)
    assert row is not None
    return row.state


async def test_a_request_outlives_a_restart_and_its_old_prompt_still_answers_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", RM, id="c_rm")]), Reply(text="Removed the junk.")
    )
    board = Board()
    before = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: before) as agent:
        await agent.submit(inbound("clean up"), before)
        request = await before.wait_asked()
        await agent.store.flush()
        run_id = (await agent.store.runs(conv=CONV))[0].id
        # Waiting on a human is not "started": the call has run nothing.
        assert await agent.store.tool_calls(run_id) == {}
        row = await agent.store.approval(request.id)
        assert row is not None
        assert (row.state, row.run_id, row.call_id) == ("pending", run_id, "c_rm")
        assert row.prompt == PromptRef("c1", "m1", f"Approve {SUMMARY}?")
        await agent.shutdown(grace=0.1)  # a deploy
    assert before.finals == [RESTARTING_APPROVAL_TEXT]
    assert board.prompts["m1"] == f"Approve {SUMMARY}?"  # not settled: still answerable
    assert junk.exists()

    after = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: after) as agent:
        await agent.reconcile()
        again = await after.wait_asked()
        assert (again.id, again.prompt) == (request.id, row.prompt)
        assert again.timeout <= request.timeout
        assert after.sent == []  # no "send /resume": it goes on by itself
        assert list(board.prompts) == ["m1"]  # no second prompt
        assert await after.click(agent, request.id) == "ok"
        await agent.wait_idle()
        assert after.finals == ["Removed the junk."]
        assert (await agent.store.run(run_id)).state == "completed"  # type: ignore[union-attr]
        assert await _approval_state(agent, request.id) == "approved"
    assert board.prompts["m1"].endswith("✅ Approved by ann")
    assert not junk.exists()


async def test_after_a_crash_the_waiting_run_goes_on_with_the_time_left(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    board = Board()
    run_id, request_id = await _crash_while_asking(fake_llm, tmp_path, board, asked_ago=100)
    fake_llm.script(Reply(text="Removed the junk."))
    chat = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        assert await agent.reconcile() == [run_id]
        request = await chat.wait_asked()
        assert request.id == request_id
        assert request.prompt == PromptRef("c1", "m1", f"Approve {SUMMARY}?")
        assert 190 < request.timeout <= 200  # 300 s from the first request, 100 s ago
        assert chat.sent == []
        assert await chat.click(agent, request_id, user="U2") == "not_approver"
        assert await chat.click(agent, request_id) == "ok"
        await agent.wait_idle()
        assert chat.finals == ["Removed the junk."]
        assert await chat.click(agent, request_id) == "unknown"  # a second click
    assert list(board.prompts) == ["m1"]
    assert board.prompts["m1"].endswith("✅ Approved by ann")
    assert not junk.exists()


async def test_a_click_before_the_run_is_back_is_kept_for_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    board = Board()
    run_id, request_id = await _crash_while_asking(fake_llm, tmp_path, board, asked_ago=5)
    fake_llm.script(Reply(text="Removed the junk."))
    chat = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        # The channel is up before the agent reconciles: the click reaches the store.
        assert await chat.click(agent, request_id, user="U2") == "not_approver"
        assert await chat.click(agent, request_id) == "ok"
        assert board.prompts["m1"].endswith("✅ Approved by ann")
        assert await chat.click(agent, request_id, allow=False) == "unknown"  # first one stands
        await agent.reconcile()
        await agent.wait_idle()
        assert chat.asked == []  # the answer was there: nobody asked again
        assert chat.finals == ["Removed the junk."]
        assert await _approval_state(agent, request_id) == "approved"
        assert (await agent.store.run(run_id)).state == "completed"  # type: ignore[union-attr]
    assert not junk.exists()


async def test_the_deadline_counts_from_the_first_request(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    board = Board()
    _, request_id = await _crash_while_asking(fake_llm, tmp_path, board, asked_ago=400, timeout=300)
    fake_llm.script(Reply(text="Nobody answered, so I left it."))
    chat = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        assert await chat.click(agent, request_id) == "unknown"  # too late already
        await agent.reconcile()
        await agent.wait_idle()
        assert [r.timeout for r in chat.asked] == [0.0]
        assert chat.finals == ["Nobody answered, so I left it."]
        assert await _approval_state(agent, request_id) == "denied"
    assert board.prompts == {"m1": f"Approve {SUMMARY}? {TIMED_OUT}"}
    results = [m for m in fake_llm.requests[-1].json["messages"] if m["role"] == "tool"]
    assert "not approved" in results[-1]["content"]
    assert junk.exists()


async def test_new_input_after_a_crash_supersedes_the_waiting_run(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    board = Board()
    run_id, request_id = await _crash_while_asking(fake_llm, tmp_path, board, asked_ago=5)
    fake_llm.script(Reply(text="Something else, then."))
    chat = PromptResponder(board=board)
    async with running_agent(fake_llm, tmp_path, responders=lambda key: chat) as agent:
        await agent.submit(inbound("never mind"), chat)  # before the agent reconciles
        await agent.reconcile()
        await agent.wait_idle()
        assert chat.asked == []
        assert [text for text in chat.finals if text] == ["Something else, then."]
        assert await _approval_state(agent, request_id) == "expired"
        assert await chat.click(agent, request_id) == "unknown"
        assert (await agent.store.run(run_id)).state == "timed_out"  # type: ignore[union-attr]
    assert junk.exists()
