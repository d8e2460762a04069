"""`[mcp.servers.<name>]`: bad settings are a ConfigError naming the key; categories come
from the overrides, then trusted annotations, then the default; a server's program is
Parley's configuration (tools cannot rewrite it); nothing loads the SDK unless a server is
configured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.app import App, build_registry
from core.errors import ConfigError
from core.mcp.config import McpServerConfig
from core.tools.base import ToolContext
from core.tools.running import run_in_workspace
from tests.agentkit import agent_config
from tests.fakes.llm import FakeLLM
from tests.mcp.conftest import stdio_server
from tests.process import REPO


def server(**settings: Any) -> dict[str, Any]:
    return {"mcp": {"servers": {"notes": {"command": ["true"], **settings}}}}


def one(**settings: Any) -> dict[str, Any]:
    """`[mcp]` with one server, `n`."""
    return {"servers": {"n": settings}}


N = "mcp.servers.n"


@pytest.mark.parametrize(
    ("mcp", "key", "words"),
    [
        ({"servers": {"Notes": {"command": ["x"]}}}, "mcp.servers", "lower-case"),
        (one(command=["x"], url="http://h/mcp"), N, "exactly one"),
        (one(), N, "exactly one"),
        (one(url="ftp://h/x"), f"{N}.url", "http(s)"),
        (one(url="http://u:p@h/x"), f"{N}.url", "headers_env"),
        (one(command=["x"], headers_env={"A": "B"}), N, "HTTP"),
        (one(url="http://h/x", env=["TOKEN"]), N, "stdio"),
        (one(command=["x"], env=["A-B"]), f"{N}.env", "variable"),
        (one(command=["x"], tools={"t": "maybe"}), f"{N}.tools.t", "deny"),
        (one(command=["x"], default="all"), f"{N}.default", "admin"),
    ],
)
def test_bad_settings_name_their_key(
    fake_llm: FakeLLM, tmp_path: Path, mcp: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        agent_config(fake_llm, tmp_path, mcp=mcp)
    assert caught.value.key == key
    assert words in caught.value.problem


def test_a_variable_the_server_needs_must_be_set(fake_llm: FakeLLM, tmp_path: Path) -> None:
    cfg = agent_config(fake_llm, tmp_path, **server(env=["NOTES_TOKEN"]))
    with pytest.raises(ConfigError) as caught:
        App(cfg, {}, build_registry(cfg, {}))
    assert caught.value.key == "mcp.servers.notes.env"
    assert "NOTES_TOKEN" in caught.value.problem
    http = {
        "mcp": {"servers": {"h": {"url": "http://127.0.0.1:9/mcp", "headers_env": {"X-K": "K"}}}}
    }
    cfg = agent_config(fake_llm, tmp_path, **http)
    with pytest.raises(ConfigError) as caught:
        App(cfg, {}, build_registry(cfg, {}))
    assert caught.value.key == "mcp.servers.h.headers_env.X-K"


@pytest.mark.parametrize(
    ("settings", "hints", "expected"),
    [
        ({}, (None, None), "admin"),  # the default default asks
        ({"default": "write"}, (True, None), "write"),  # a read-only hint alone lowers nothing
        ({"default": "write", "trust_annotations": True}, (True, None), "read"),
        ({"default": "write", "trust_annotations": True, "tools": {"t": "admin"}},
         (True, None), "admin"),
        ({"default": "write"}, (None, True), "admin"),  # a destructive hint raises
        ({"default": "read"}, (False, True), "admin"),
        ({"default": "write", "tools": {"t": "write"}}, (None, True), "write"),  # listed: as listed
        ({"default": "deny", "tools": {"t": "read"}}, (None, None), "read"),
        ({"default": "read", "tools": {"t": "deny"}}, (True, False), "deny"),
    ],
)  # fmt: skip
def test_categories(
    settings: dict[str, Any], hints: tuple[bool | None, bool | None], expected: str
) -> None:
    config = McpServerConfig(command=["x"], **settings)
    read_only, destructive = hints
    assert config.category("t", read_only_hint=read_only, destructive_hint=destructive) == expected


@pytest.mark.usefixtures("landlock_required")
async def test_tools_cannot_rewrite_a_servers_program(fake_llm: FakeLLM, tmp_path: Path) -> None:
    """The server's script sits in the workspace (a writable root): still frozen."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    script = workspace / "notes_server.py"
    script.write_text("print('the server')\n")
    cfg = agent_config(
        fake_llm, tmp_path, mcp={"servers": {"notes": {"command": ["python3", str(script)]}}}
    )
    app = App(cfg, {}, build_registry(cfg, {}))
    command = (
        f"echo 'import os' >> {script}; "
        f"echo 'planted' > {workspace}/new.py; mv -f {workspace}/new.py {script}; cat {script}"
    )
    try:  # bash in the sandbox, past the text checks: the wall alone must hold
        ctx = ToolContext(sandbox=app.config.tools, jail=app.jail)
        result = await run_in_workspace(["bash", "-c", command], ctx, timeout=20)
    finally:
        await app.aclose()
    assert script.read_text() == "print('the server')\n", result.text
    assert "Permission denied" in result.text


def test_no_mcp_import_unless_a_server_is_configured(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        'default_provider = "p"\n[providers.p]\nkind = "openai_chat"\n'
        'base_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        f'[store]\npath = "{tmp_path / "db"}"\n[tools]\ntools_file = ""\n'
    )
    probe = (
        "import sys; from pathlib import Path; from bot.config import load_config; "
        "from bot.app import App, build_registry; "
        f"c = load_config(Path({str(config)!r})); a = App(c, {{}}, build_registry(c, {{}})); "
        "a.conversation('p'); print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mcp', 'mcp_types', 'jsonschema', 'uvicorn', 'starlette')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    assert "mcp" in stdio_server()["command"][1]  # the configured case is the other tests'
