"""Durable approvals: an approver's "Always here" / "Always in this channel" lets a tool run
without asking from then on, there and only there; `/grants` lists and revokes them; a
call escalated above its tool's category (a destructive `bash` command) always asks."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from channels.approvals import Approvals
from core.chat import ApprovalRequest, GrantScope
from core.store import ApprovalRow, GrantRow
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec


@dataclass
class ClickingChannel(RecordingResponder):
    """A channel end whose prompts go through the real `Approvals` and get one click:
    approve, always (`scope`) or deny, by the approver bob."""

    scope: GrantScope | None = None
    approvers: Approvals = field(default_factory=lambda: Approvals({"U2"}))
    settled: list[str] = field(default_factory=list)

    async def approve(self, request: ApprovalRequest) -> bool:
        self.approvals.append(request)

        async def show(shown: ApprovalRequest) -> None:
            loop = asyncio.get_running_loop()
            loop.call_soon(
                self.approvers.resolve, shown.id, "U2", "bob", bool(self.approve_with), self.scope
            )

        async def settle(settled: ApprovalRequest, text: str) -> None:
            self.settled.append(text)

        return await self.approvers.request(request, show, settle)


def deploy_tool(tmp_path: Path) -> dict[str, Any]:
    tools = [
        {
            "name": "deploy",
            "description": "Deploy the service.",
            "category": "admin",
            "cmd": "echo",
            "args": ["deployed"],
        }
    ]
    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": tools}))
    return {"tools_file": str(tmp_path / "tools.yaml")}


def deploy() -> Reply:
    return Reply(tool_calls=[ToolCallSpec("deploy", {})])


async def test_always_here_holds_in_this_conversation_until_revoked(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(deploy(), Reply(text="1"), deploy(), Reply(text="2"))
    chat = ClickingChannel(scope="conversation")
    tools = deploy_tool(tmp_path)
    async with running_agent(fake_llm, tmp_path, tools=tools) as agent:
        await agent.submit(inbound("deploy"), chat)
        await agent.wait_idle()
        assert [r.grantable for r in chat.approvals] == [True]
        assert chat.settled == ["✅ Approved by bob (always, here)"]
        await agent.submit(inbound("deploy again"), chat)
        await agent.wait_idle()
        assert len(chat.approvals) == 1  # not asked again
        assert chat.finals == ["1", "2"]
        await agent.submit(inbound("/grants"), chat)
        listing = chat.sent[-1]
        assert "deploy — this conversation; by bob on " in listing
        grant_id = listing.splitlines()[1].split()[0]
        await agent.submit(inbound(f"/grants revoke {grant_id}"), chat)
        assert chat.sent[-1] == "Revoked: deploy asks an approver again here."
        fake_llm.script(deploy(), Reply(text="3"))
        chat.scope = None
        await agent.submit(inbound("and once more"), chat)
        await agent.wait_idle()
    assert len(chat.approvals) == 2  # asked again after the revoke
    assert chat.finals == ["1", "2", "3"]
    events = (tmp_path / "events.jsonl").read_text()
    for name in ("agent.grant.added", "agent.approval.granted", "agent.grant.revoked"):
        assert name in events


async def test_always_in_this_channel_covers_its_threads_and_no_other_channel(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(deploy(), Reply(text="a"), deploy(), Reply(text="b"), deploy(), Reply(text="c"))
    chat = ClickingChannel(scope="channel")
    async with running_agent(fake_llm, tmp_path, tools=deploy_tool(tmp_path)) as agent:
        await agent.submit(inbound("deploy", key=("slack", "C1", "t1")), chat)
        await agent.wait_idle()
        await agent.submit(inbound("deploy", key=("slack", "C1", "t2")), chat)  # same channel
        await agent.wait_idle()
        assert len(chat.approvals) == 1
        chat.scope = None
        await agent.submit(inbound("deploy", key=("slack", "C2", "t1")), chat)  # another
        await agent.wait_idle()
    assert len(chat.approvals) == 2
    assert chat.finals == ["a", "b", "c"]


async def test_a_denied_always_click_grants_nothing_and_escalated_calls_always_ask(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    rm = Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf build"})])
    fake_llm.script(rm, Reply(text="x"), rm, Reply(text="y"))
    chat = ClickingChannel(approve_with=False, scope="conversation")
    async with running_agent(fake_llm, tmp_path) as agent:
        # Even a stored grant of `bash` does not cover a call escalated to admin.
        agent.store.add_grant(GrantRow("g1", "conversation", "test:c1:", "bash", "eve", 1.0))
        await agent.submit(inbound("clean"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("clean again"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/grants"), chat)
    assert [r.grantable for r in chat.approvals] == [False, False]  # no "always" offered
    assert chat.settled == ["❌ Denied by bob", "❌ Denied by bob"]
    assert "bash — this conversation; by eve" in chat.sent[-1]  # nothing added by a no
    assert chat.sent[-1].count("\n") == 2


async def test_an_always_click_after_a_restart_stores_the_grant(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A click on a prompt posted before a restart, answered through the agent."""
    async with running_agent(fake_llm, tmp_path) as agent:
        now = time.time()
        row = ApprovalRow(
            "a1", "slack:C1:t1", "r1", "c1", "deploy", "deploy", "admin", "pending",
            now, now + 300, None, None, None,
        )  # fmt: skip
        await agent.store.request_approval(row)
        answered = await agent.answer_approval("a1", True, "bob", "channel")
        assert answered is not None
        await agent.store.flush()
        grants = await agent.store.grants(["slack:C1"])
    assert [(g.tool, g.scope, g.granted_by) for g in grants] == [("deploy", "channel", "bob")]
