"""HTTP MCP servers: headers come from `headers_env` (and their values are masked like
every secret), a redirect to another origin is not followed, and a server that cannot be
reached is reported, not fatal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core.messages import ToolCall
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM
from tests.mcp.conftest import free_port

SECRET = "Bearer notes-0123456789abcdef"


@pytest.fixture
async def redirector(http_server: str) -> AsyncIterator[tuple[str, list[str]]]:
    """A server on another port that answers every request with a 307 to the real MCP
    server (another origin); its URL and the paths it was asked for."""
    seen: list[str] = []

    async def bounce(request: web.Request) -> web.Response:
        seen.append(request.path)
        raise web.HTTPTemporaryRedirect(http_server)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", bounce)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/mcp", seen
    finally:
        await runner.cleanup()


async def test_headers_come_from_the_environment_and_are_masked(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    notes = {"url": http_server, "default": "read", "headers_env": {"X-Notes": "NOTES_AUTH"}}
    servers: dict[str, Any] = {"servers": {"notes": notes}}
    environ = {"NOTES_AUTH": SECRET}
    async with running_agent(fake_llm, tmp_path, mcp=servers, environ=environ) as agent:
        executor = agent.factory.conversation("fake", None).executor  # type: ignore[arg-type]
        args = json.dumps({"name": "X-Notes"})
        result = await executor.execute(ToolCall(id="h", name="mcp__notes__header", arguments=args))
    assert SECRET not in result.content
    assert result.content.startswith("[REDACTED]")  # it arrived, and did not come back


async def test_a_redirect_to_another_origin_is_not_followed(
    fake_llm: FakeLLM, tmp_path: Path, redirector: tuple[str, list[str]]
) -> None:
    url, seen = redirector
    servers = {"servers": {"notes": {"url": url, "default": "read", "connect_timeout_seconds": 5}}}
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        app: Any = agent.factory
        connection = app.mcp.connections["notes"]
        assert connection.state == "restarting"
        assert connection.tools == ()
        assert "Redirect to http://127.0.0.1" in connection.last_error
        assert "not followed" in connection.last_error
        await agent.submit(inbound("/status"), chat)
    assert seen  # it was asked, and its answer went nowhere
    assert "Mcp: notes (http): restarting — " in chat.sent[-1]


async def test_an_unreachable_server_does_not_stop_parley(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    servers = {"servers": {"notes": {"url": url, "connect_timeout_seconds": 2}}}
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:  # it starts
        await agent.submit(inbound("/status"), chat)
        app: Any = agent.factory
        assert app.mcp.connections["notes"].state == "restarting"
        assert "connect" in app.mcp.connections["notes"].last_error.lower()
    assert "Mcp: notes (http): " in chat.sent[-1]


async def test_a_changed_tool_list_is_heard_over_http(
    fake_llm: FakeLLM, tmp_path: Path, http_server: str
) -> None:
    servers = {"servers": {"notes": {"url": http_server, "default": "write"}}}
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        app: Any = agent.factory
        executor = app.conversation("fake").executor
        assert "mcp__notes__grown" not in app.registry.names()
        await executor.execute(ToolCall(id="g", name="mcp__notes__grow", arguments="{}"))
        async with asyncio.timeout(10):
            while "mcp__notes__grown" not in app.registry.names():
                await asyncio.sleep(0.02)
