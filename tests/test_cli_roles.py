"""Roles in the terminal (docs/governance.md#roles): with `[roles] terminal = "viewer"`,
`parley chat -m` and `parley chat` alike offer the model no tool the viewer's role refuses
— a built-in, a tools.yaml tool it denies by name, an MCP tool that writes — and refuse
each of them when the model calls it by name anyway. `parley` runs as a user runs it: a
subprocess on the fake LLM, with a real MCP server."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.mcp.conftest import PYTHON_PATHS, SERVER
from tests.process import child_env, parley, write_config

pytestmark = pytest.mark.usefixtures("landlock_required")

REFUSED = {"bash", "write_file", "mcp__notes__append_note", "disk_free"}
"""What the viewer may not use: two built-ins and an MCP tool that write (not its
category), and a read tool from tools.yaml (denied by name)."""
ALLOWED = {"read_file", "list_directory", "mcp__notes__read_note"}


def _viewer_config(tmp_path: Path) -> Path:
    """config.toml with the terminal in a read-only `viewer` role, a tools.yaml tool and
    the test MCP server (its `append_note` writes, its `read_note` reads)."""
    (tmp_path / "tools.yaml").write_text(
        textwrap.dedent(
            """
            tools:
              - name: disk_free
                description: "Show free disk space."
                category: read
                cmd: df
                args: ["-h"]
            """
        )
    )
    python_paths = ", ".join(f'"{p}"' for p in PYTHON_PATHS)
    return write_config(
        tmp_path,
        textwrap.dedent(
            f"""
            [roles]
            terminal = "viewer"
            [roles.viewer]
            categories = ["read"]
            deny_tools = ["disk_*"]
            [mcp.servers.notes]
            command = ["{sys.executable}", "{SERVER}", "--tag", "{uuid.uuid4().hex}"]
            read_paths = [{python_paths}]
            directory = "{tmp_path / "notes-server"}"
            default = "write"
            [mcp.servers.notes.tools]
            read_note = "read"
            """
        ),
    )


def _script_refused_calls(fake_llm: FakeLLM) -> None:
    """The model calls each refused tool by name (it was not offered them), then answers."""
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("bash", {"command": "echo hi > made.txt"}, id="c_bash"),
                ToolCallSpec("write_file", {"path": "w.txt", "content": "x"}, id="c_write"),
                ToolCallSpec(
                    "mcp__notes__append_note", {"title": "log", "text": "x"}, id="c_append"
                ),
                ToolCallSpec("disk_free", {}, id="c_disk"),
                ToolCallSpec("mcp__notes__read_note", {"title": "log"}, id="c_read"),
            ]
        ),
        Reply(text="I may only read here."),
    )


def _assert_refused_and_not_offered(fake_llm: FakeLLM, tmp_path: Path) -> None:
    first, second = fake_llm.requests[-2:]
    offered = {t["function"]["name"] for t in first.json["tools"]}
    assert offered >= ALLOWED
    assert not offered & REFUSED
    assert {t["function"]["name"] for t in second.json["tools"]} == offered
    results = {
        m["tool_call_id"]: m["content"] for m in second.json["messages"] if m["role"] == "tool"
    }
    for call_id in ("c_bash", "c_write", "c_append", "c_disk"):
        assert "is not allowed for your role (viewer)" in results[call_id], results[call_id]
    assert "it needs the role admin or member" in results["c_bash"]
    assert results["c_read"] == "no note called log"  # what the role allows still runs
    assert not (tmp_path / "ws" / "made.txt").exists()
    assert not (tmp_path / "ws" / "w.txt").exists()
    assert not (tmp_path / "notes-server" / "notes").exists()


async def test_a_one_shot_turn_neither_offers_nor_runs_what_the_terminal_role_refuses(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config = _viewer_config(tmp_path)
    _script_refused_calls(fake_llm)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley("--config", str(config), "chat", "-m", "try it", env=env)
    assert code == 0, err
    assert out == "I may only read here.\n"
    _assert_refused_and_not_offered(fake_llm, tmp_path)
    fake_llm.assert_complete()


async def test_an_interactive_chat_neither_offers_nor_runs_what_the_terminal_role_refuses(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config = _viewer_config(tmp_path)
    _script_refused_calls(fake_llm)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley(
        "--config", str(config), "chat", env=env, stdin=b"try it\n/exit\n"
    )
    assert code == 0, err
    assert "I may only read here." in out
    _assert_refused_and_not_offered(fake_llm, tmp_path)
    fake_llm.assert_complete()


async def test_without_roles_a_one_shot_turn_offers_every_tool(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """No `[roles]`: the terminal is the built-in `admin`, offered everything (and the
    one-shot turn does not load `core.roles` for it: tests/test_cli.py)."""
    fake_llm.script(Reply(text="hi"))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 0, err
    offered = {t["function"]["name"] for t in fake_llm.requests[0].json["tools"]}
    assert offered >= {"bash", "write_file", "read_file"}
