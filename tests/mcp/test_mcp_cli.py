"""MCP from the command line: `parley chat -m` starts the configured servers for its one
turn; `parley chat` killed with SIGKILL while an MCP call that writes is running takes its
server with it, and after a restart `/resume` does not run the call again (it may have
taken effect), and says so."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import uuid
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.helpers import pids_running, wait_dead
from tests.mcp.conftest import PYTHON_PATHS, SERVER
from tests.process import child_env, parley, start_parley, write_config

pytestmark = pytest.mark.usefixtures("landlock_required")


def _notes_config(tmp_path: Path, tag: str, directory: Path) -> Path:
    return write_config(
        tmp_path,
        f"""
[mcp.servers.notes]
command = ["{sys.executable}", "{SERVER}", "--tag", "{tag}"]
read_paths = {[str(p) for p in PYTHON_PATHS]!r}
directory = "{directory}"
default = "write"
""".replace("'", '"'),
    )


async def test_a_one_shot_turn_uses_the_servers(fake_llm: FakeLLM, tmp_path: Path) -> None:
    config = _notes_config(tmp_path, uuid.uuid4().hex, tmp_path / "notes-server")
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__read_note", {"title": "x"}, "r")]),
        Reply(text="there is no such note"),
    )
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley("--config", str(config), "chat", "-m", "read x", env=env)
    assert code == 0, err
    assert out.strip() == "there is no such note"
    assert fake_llm.requests[-1].json["messages"][-1]["content"] == "no note called x"


def _started_calls(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with sqlite3.connect(db) as conn:
        try:
            return {row[0] for row in conn.execute("SELECT call_id FROM tool_calls")}
        except sqlite3.OperationalError:  # the schema is not there yet
            return set()


async def test_sigkill_during_a_writing_mcp_call_then_resume_does_not_repeat_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex
    directory = tmp_path / "notes-server"
    config = _notes_config(tmp_path, tag, directory)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec(
                    "mcp__notes__append_note",
                    {"title": "log", "text": "once", "wait_for": "go"},
                    id="c_mcp",
                )
            ]
        )
    )
    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdin is not None
    proc.stdin.write(b"write it down\n")
    await proc.stdin.drain()
    async with asyncio.timeout(60):
        while (
            "c_mcp" not in _started_calls(tmp_path / "parley.db")
            or not (directory / "notes" / "log").exists()
        ):
            await asyncio.sleep(0.05)
    server = pids_running(sys.executable, str(SERVER), "--tag", tag)
    assert len(server) == 1  # the server, as the host sees it
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    assert wait_dead(server, within=10) == []  # it died with Parley
    (directory / "go").touch()

    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdout is not None
    assert proc.stdin is not None
    async with asyncio.timeout(60):
        hint = (await proc.stdout.readline()).decode()
    assert "interrupted" in hint
    assert "/resume" in hint
    proc.stdin.write(b"/resume\n")
    await proc.stdin.drain()
    out, err = await asyncio.wait_for(proc.communicate(b"/exit\n"), 60)
    assert proc.returncode == 0, err
    assert "can't safely resume" in out.decode()
    assert "`mcp__notes__append_note`" in out.decode()
    assert (directory / "notes" / "log").read_text() == "once\n"  # not run again
    assert len(fake_llm.requests) == 1  # nothing more was asked of the model
