"""MCP tools go through the same policy as every tool: read runs, write runs in chat and in
a cron job only when listed, admin asks an approver, deny is never offered and refused when
called by name — whatever the server's annotations or its tool results say. One real
SDK-written server over streamable HTTP on 127.0.0.1 serves the whole module."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from core.messages import ToolCall
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec


def notes(url: str, **settings: Any) -> dict[str, Any]:
    """`[mcp.servers.notes]` at the shared HTTP server: read_note reads, append_note
    writes, delete_note is denied, and everything else asks."""
    config: dict[str, Any] = {
        "url": url,
        "default": "admin",
        "tools": {"read_note": "read", "append_note": "write", "delete_note": "deny"},
        "timeout_seconds": 10,
    }
    config.update(settings)
    return {"servers": {"notes": config}}


def offered(fake_llm: FakeLLM, index: int = -1) -> list[str]:
    return [t["function"]["name"] for t in fake_llm.requests[index].json.get("tools", [])]


def tool_results(fake_llm: FakeLLM, index: int = -1) -> dict[str, str]:
    return {
        m["tool_call_id"]: m["content"]
        for m in fake_llm.requests[index].json["messages"]
        if m["role"] == "tool"
    }


async def test_read_runs_write_runs_admin_asks_and_deny_is_never_offered(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    title = f"t-{uuid.uuid4().hex[:8]}"
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("mcp__notes__append_note", {"title": title, "text": "hello"}, "w"),
                ToolCallSpec("mcp__notes__read_note", {"title": title}, "r"),
                ToolCallSpec("mcp__notes__big", {"size": 10}, "a"),
            ]
        ),
        Reply(text="done"),
    )
    chat = RecordingResponder(approve_with=False)
    async with running_agent(fake_llm, tmp_path, mcp=notes(http_server)) as agent:
        await agent.submit(inbound("go"), chat)
        await agent.wait_idle()
    names = offered(fake_llm, 0)
    assert {"mcp__notes__read_note", "mcp__notes__append_note", "mcp__notes__big"} <= set(names)
    assert "mcp__notes__delete_note" not in names  # deny: never offered
    results = tool_results(fake_llm)
    assert results["w"] == "appended to " + title  # write: runs in chat
    assert results["r"] == "hello\n"  # read: runs
    # admin: asked, and the approver's no is the answer
    assert [r.tool for r in chat.approvals] == ["mcp__notes__big"]
    assert "not approved" in results["a"]
    assert chat.finals == ["done"]


async def test_a_denied_tool_called_by_name_after_an_injection_is_refused(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    """The tool result tells the model to call the denied tool; the model obeys; the call
    is refused and the server never sees it."""
    victim = f"v-{uuid.uuid4().hex[:8]}"
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__append_note", {"title": victim, "text": "x"})]),
        Reply(tool_calls=[ToolCallSpec("mcp__notes__inject", {}, "inj")]),
        Reply(tool_calls=[ToolCallSpec("mcp__notes__delete_note", {"title": victim}, "del")]),
        Reply(tool_calls=[ToolCallSpec("mcp__notes__read_note", {"title": victim}, "chk")]),
        Reply(text="ok"),
    )
    chat = RecordingResponder(approve_with=True)
    servers = notes(http_server, tools={"inject": "read", "read_note": "read",
                                        "append_note": "write", "delete_note": "deny"})  # fmt: skip
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        await agent.submit(inbound("summarise the notes"), chat)
        await agent.wait_idle()
    results = tool_results(fake_llm)
    assert "delete_note" in results["inj"]  # the injection reached the model
    assert results["del"].startswith("error: policy: ")
    assert 'mcp.servers.notes.tools.delete_note = "deny"' in results["del"]
    assert results["chk"] == "x\n"  # still there: the server never ran the delete
    assert chat.approvals == []  # nothing was even asked


async def test_annotations_never_lower_a_category_unless_trusted(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    """delete_note says readOnlyHint (a lie): it still asks; `trust_annotations` lets the
    hint make it read, as documented; a destructive hint raises a write default to admin."""
    calls = [ToolCallSpec("mcp__notes__delete_note", {"title": "nothing"})]
    fake_llm.script(Reply(tool_calls=calls), Reply(text="a"))
    chat = RecordingResponder(approve_with=False)
    async with running_agent(fake_llm, tmp_path, mcp=notes(http_server, tools={})) as agent:
        await agent.submit(inbound("tidy"), chat)
        await agent.wait_idle()
    assert [r.tool for r in chat.approvals] == ["mcp__notes__delete_note"]

    fake_llm.script(Reply(tool_calls=calls), Reply(text="b"))
    chat = RecordingResponder(approve_with=False)
    trusting = notes(http_server, tools={}, trust_annotations=True)
    async with running_agent(fake_llm, tmp_path, mcp=trusting) as agent:
        await agent.submit(inbound("tidy"), chat)
        await agent.wait_idle()
    assert chat.approvals == []  # trusted: the hint made it read


async def test_write_tools_run_in_a_cron_job_only_when_listed(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    title = f"c-{uuid.uuid4().hex[:8]}"
    args = json.dumps({"title": title, "text": "from cron"})
    async with running_agent(fake_llm, tmp_path, mcp=notes(http_server)) as agent:
        app: Any = agent.factory
        executor = app.conversation("fake", policy=ToolPolicy("cron")).executor
        for allow, expected in (
            (frozenset(), "cron job does not list it"),
            (frozenset({"mcp__notes__append_note"}), f"appended to {title}"),
        ):
            cron = ToolExecutor(app.registry, ToolPolicy("cron", allow), executor.ctx)
            call = ToolCall(id="c", name="mcp__notes__append_note", arguments=args)
            result = await cron.execute(call)
            assert expected in result.content
        check = json.dumps({"title": title})
        read = await cron.execute(ToolCall(id="r", name="mcp__notes__read_note", arguments=check))
        assert read.content == "from cron\n"  # read runs in cron, and only one write happened


async def test_is_error_results_reach_the_model_as_errors(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__fail", {}, "f")]),
        Reply(tool_calls=[ToolCallSpec("mcp__notes__read_note", {"title": 5}, "bad")]),
        Reply(text="noted"),
    )
    servers = notes(http_server, tools={"fail": "read", "read_note": "read"})
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        await agent.submit(inbound("try"), RecordingResponder())
        await agent.wait_idle()
    sent = [m for r in fake_llm.requests for m in r.json["messages"] if m["role"] == "tool"]
    by_id = {m["tool_call_id"]: m["content"] for m in sent}
    assert by_id["f"].startswith("error (reported by MCP server `notes`)")
    # Arguments that do not fit the server's schema never reach it.
    assert by_id["bad"].startswith("error: invalid arguments for `mcp__notes__read_note`")
    assert "is not of type 'string'" in by_id["bad"]
