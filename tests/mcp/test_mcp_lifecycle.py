"""A stdio MCP server's life: a call that hangs ends with an error and the turn goes on; a
crash mid-call is not repeated (unless the call only reads) and the server comes back; a
server that keeps crashing is parked, shown in /status, and its tools say so; a 20 MB
result is cut like any tool output; /stop cancels a running call; a changed tool list
reaches the next turn, never the running one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build_registry
from bot.config import load_config
from core.agent import Agent
from core.messages import CANCELLED_RESULT, ToolCall
from core.tools.executor import ToolExecutor
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.mcp.conftest import stdio_server
from tests.process import fake_llm_config

pytestmark = pytest.mark.usefixtures("landlock_required")


@asynccontextmanager
async def notes_agent(
    fake_llm: FakeLLM, tmp_path: Path, **server: Any
) -> AsyncIterator[tuple[Agent, Path]]:
    """An agent whose `notes` server is `server.py` over stdio; and the server's directory."""
    directory = tmp_path / "notes-server"
    servers = {"servers": {"notes": stdio_server(directory=str(directory), **server)}}
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        yield agent, directory


def executor_of(agent: Agent) -> ToolExecutor:
    """A conversation's executor whose retry sleeps pass at once."""
    executor: ToolExecutor = agent.factory.conversation("fake", None).executor  # type: ignore[arg-type]
    return replace(executor, clock=FakeClock())


async def call(executor: ToolExecutor, tool: str, **args: Any) -> tuple[str, bool]:
    message = await executor.execute(
        ToolCall(id=f"c-{tool}", name=f"mcp__notes__{tool}", arguments=json.dumps(args))
    )
    return message.content, message.is_error


async def test_a_call_that_hangs_ends_with_an_error_and_the_turn_goes_on(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__hang", {}, "h")]),
        Reply(tool_calls=[ToolCallSpec("mcp__notes__read_note", {"title": "x"}, "r")]),
        Reply(text="it hung, I moved on"),
    )
    chat = RecordingResponder()
    settings = {"default": "write", "tools": {"read_note": "read"}, "timeout_seconds": 1}
    async with notes_agent(fake_llm, tmp_path, **settings) as (agent, directory):
        await agent.submit(inbound("try"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/status"), chat)
        status = chat.sent[-1]
    results = {m["tool_call_id"]: m["content"] for m in fake_llm.requests[-1].json["messages"]
               if m["role"] == "tool"}  # fmt: skip
    assert results["h"].startswith("error: `hang` on MCP server `notes` did not answer within 1 s")
    assert (directory / "hanging.log").read_text() == "hang\n"  # asked once, not again
    assert results["r"] == "no note called x"  # the server still answers
    assert chat.finals == ["it hung, I moved on"]
    assert "Mcp: notes (stdio, " in status


async def test_a_crash_mid_call_is_not_repeated_and_the_server_comes_back(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with notes_agent(fake_llm, tmp_path, default="write") as (agent, directory):
        executor = executor_of(agent)
        text, failed = await call(executor, "crash_once")
        assert failed
        assert "connection to MCP server `notes` was lost during `crash_once`" in text
        assert "not retried" in text
        assert (directory / "crashes.log").read_text() == "crash\n"  # ran once
        assert await call(executor, "read_note", title="x") == ("no note called x", False)


async def test_a_read_call_lost_to_a_crash_is_retried(fake_llm: FakeLLM, tmp_path: Path) -> None:
    settings = {"default": "write", "tools": {"crash_once": "read"}}  # it keeps a mark
    async with notes_agent(fake_llm, tmp_path, **settings) as (agent, directory):
        assert await call(executor_of(agent), "crash_once") == ("survived", False)
        assert (directory / "crashes.log").read_text() == "crash\n"


async def test_a_server_that_keeps_crashing_is_parked_and_its_tools_say_so(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    chat = RecordingResponder()
    async with notes_agent(fake_llm, tmp_path, default="write", max_restarts=2) as (agent, _d):
        executor = executor_of(agent)
        await call(executor, "crash")
        await call(executor, "crash")
        app: Any = agent.factory
        async with asyncio.timeout(20):
            while app.mcp.connections["notes"].state != "parked":
                await asyncio.sleep(0.05)
        text, failed = await call(executor, "read_note", title="x")
        assert failed
        assert "MCP server `notes` is parked after 2 failures" in text
        assert "mcp__notes__read_note" in app.registry.names()  # still there, answering
        await agent.submit(inbound("/status"), chat)
    assert "Mcp: notes (stdio): PARKED after 2 failures — the server ended" in chat.sent[-1]


async def test_a_20_mb_result_is_cut_with_the_whole_kept_as_an_artifact(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    size = 20 << 20
    async with notes_agent(fake_llm, tmp_path, default="read") as (agent, _directory):
        message = await executor_of(agent).execute(
            ToolCall(id="b", name="mcp__notes__big", arguments=json.dumps({"size": size}))
        )
    assert not message.is_error
    assert len(message.content.encode()) < 70_000  # output_cap_bytes (64 KiB) and a notice
    assert f"{size - 65536:,} bytes cut; full output in" in message.content
    (artifact,) = message.artifacts
    assert Path(artifact).stat().st_size == size
    assert Path(artifact).is_relative_to(tmp_path / "artifacts")


async def test_stop_cancels_a_running_mcp_call(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("mcp__notes__hang", {}, "h")]))
    chat = RecordingResponder()
    settings = {"default": "write", "tools": {"hang": "read"}, "timeout_seconds": 300}
    async with notes_agent(fake_llm, tmp_path, **settings) as (agent, directory):
        await agent.submit(inbound("wait for it"), chat)
        async with asyncio.timeout(20):
            while not (directory / "hanging.log").exists():
                await asyncio.sleep(0.02)
        await agent.submit(inbound("/stop"), chat)
        async with asyncio.timeout(10):
            await agent.wait_idle()
        lane = agent.lanes[("test", "c1", "")]
        assert lane.conversation is not None
        last = lane.conversation.messages[-1]
        assert (last.tool_call_id, last.content) == ("h", CANCELLED_RESULT)
        # The server is still up: the next call answers.
        assert await call(executor_of(agent), "read_note", title="x") == ("no note called x", False)


async def test_a_changed_tool_list_reaches_the_next_turn_not_the_running_one(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__grow", {}, "g")]),
        Reply(text="grown"),
        Reply(text="next turn"),
    )
    chat = RecordingResponder()
    async with notes_agent(fake_llm, tmp_path, default="write") as (agent, _directory):
        await agent.submit(inbound("grow"), chat)
        await agent.wait_idle()
        app: Any = agent.factory
        async with asyncio.timeout(10):
            while "mcp__notes__grown" not in app.registry.names():
                await asyncio.sleep(0.02)
        await agent.submit(inbound("again"), chat)
        await agent.wait_idle()
    offered = [
        {t["function"]["name"] for t in request.json["tools"]} for request in fake_llm.requests
    ]
    assert "mcp__notes__grown" not in offered[0]
    assert "mcp__notes__grown" not in offered[1]  # the same turn keeps its tools
    assert "mcp__notes__grown" in offered[2]


async def test_a_reload_starts_a_parked_server_again(fake_llm: FakeLLM, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    server = stdio_server(default="write", max_restarts=2)
    toml = (
        "[mcp.servers.notes]\n"
        f"command = {json.dumps(server['command'])}\n"
        f"read_paths = {json.dumps(server['read_paths'])}\n"
        'default = "write"\nmax_restarts = 2\n'
    )
    path.write_text(fake_llm_config(fake_llm.base_url, tmp_path, toml))
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    agent = await app.open_agent()
    try:
        executor = executor_of(agent)
        await call(executor, "crash")
        await call(executor, "crash")
        assert app.mcp is not None
        async with asyncio.timeout(20):
            while app.mcp.connections["notes"].state != "parked":
                await asyncio.sleep(0.05)
        app.reload()
        async with asyncio.timeout(20):
            while app.mcp.connections["notes"].state != "ready":
                await asyncio.sleep(0.05)
        assert await call(executor_of(agent), "read_note", title="x") == ("no note called x", False)
    finally:
        await app.close_agent(agent)
        await app.aclose()
