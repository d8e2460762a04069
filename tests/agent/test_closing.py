"""A script that uses the agent and raises still exits: the store (whose aiosqlite worker
thread is not a daemon) is closed however the block ends."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

from tests.process import REPO, child_env

SCRIPT = """
import asyncio
from bot.app import App, build_registry
from bot.config import parse_config
from core.store import open_store

async def main(state):
    config = parse_config({{
        "default_provider": "p",
        "providers": {{"p": {{"kind": "openai_chat", "model": "m", "base_url": "http://x"}}}},
        "tools": {{
            "workspace": state + "/ws", "artifacts_dir": state + "/art", "tools_file": None
        }},
        "store": {{"path": state + "/parley.db", "events_log": state + "/events.jsonl"}},
    }})
    app = App(config, {{}}, build_registry(config, {{}}))
    {body}

asyncio.run(main({state!r}))
"""


async def _run(tmp_path: Path, body: str) -> tuple[int, str]:
    code = SCRIPT.format(body=textwrap.indent(body, "    ").strip(), state=str(tmp_path))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO, env=child_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError as exc:
        proc.kill()
        raise AssertionError("the script did not exit: something kept it alive") from exc
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_a_script_that_raises_inside_the_agent_block_exits(tmp_path: Path) -> None:
    body = """
async with app.running_agent() as agent:
    await agent.store.flush()
    raise RuntimeError("boom")
"""
    code, out = await _run(tmp_path, body)
    assert code == 1
    assert "RuntimeError: boom" in out


async def test_a_script_that_raises_inside_a_store_block_exits(tmp_path: Path) -> None:
    body = """
async with await open_store(state + "/other.db") as store:
    store.tool_group_ended(1)
    raise RuntimeError("boom")
"""
    code, out = await _run(tmp_path, body)
    assert code == 1
    assert "RuntimeError: boom" in out
