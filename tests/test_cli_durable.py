"""Crash and resume with a real process: `parley chat` is killed with SIGKILL in the middle
of a run, restarted, and `/resume` goes on without repeating a completed side effect."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.process import child_env, parley, start_parley, write_config

# A tool that blocks until the test creates the file `go` in the workspace.
TOOLS_YAML = """
tools:
  - name: wait_for_go
    description: "Wait until the file go exists."
    category: {category}
    cmd: sh
    args: ["-c", "while [ ! -f go ]; do sleep 0.05; done; echo ready"]
    timeout: 60
    parameters: {{}}
"""


async def _start_chat(config: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await start_parley("--config", str(config), "chat", env=env)


def _started_calls(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute("SELECT call_id FROM tool_calls").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return set()
    return {r[0] for r in rows}


async def _crash_during_second_tool(
    fake_llm: FakeLLM, tmp_path: Path, category: str
) -> tuple[Path, dict[str, str]]:
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML.format(category=category))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    effects = tmp_path / "ws" / "effects.txt"
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("bash", {"command": "echo one >> effects.txt"}, id="c_effect"),
                ToolCallSpec("wait_for_go", {}, id="c_wait"),
            ]
        )
    )
    proc = await _start_chat(config, env)
    assert proc.stdin is not None
    proc.stdin.write(b"do the work\n")
    await proc.stdin.drain()
    db = tmp_path / "parley.db"
    async with asyncio.timeout(30):
        while "c_wait" not in _started_calls(db):
            await asyncio.sleep(0.05)
    assert effects.read_text() == "one\n"
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    (tmp_path / "ws" / "go").touch()  # lets the orphaned tool process end
    return config, env


async def _resume(config: Path, env: dict[str, str]) -> tuple[str, str]:
    proc = await _start_chat(config, env)
    assert proc.stdout is not None
    assert proc.stdin is not None
    async with asyncio.timeout(30):
        hint = (await proc.stdout.readline()).decode()
    assert "interrupted" in hint
    assert "/resume" in hint
    proc.stdin.write(b"/resume\n")
    await proc.stdin.drain()
    out, err = await asyncio.wait_for(proc.communicate(b"/exit\n"), 30)
    assert proc.returncode == 0, err
    return hint + out.decode(), err.decode()


async def test_sigkill_mid_run_then_resume_does_not_repeat_a_side_effect(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config, env = await _crash_during_second_tool(fake_llm, tmp_path, "read")
    fake_llm.script(Reply(text="all finished"))
    out, _ = await _resume(config, env)
    assert "all finished" in out
    # The completed side effect ran once; the idempotent call was run again to completion.
    assert (tmp_path / "ws" / "effects.txt").read_text() == "one\n"
    results = {
        m["tool_call_id"]: m["content"]
        for m in fake_llm.requests[-1].json["messages"]
        if m["role"] == "tool"
    }
    assert "ready" in results["c_wait"]
    code, listing, _ = await parley("--config", str(config), "runs", env=env)
    assert code == 0
    run_line = next(line for line in listing.splitlines()[1:] if line.strip())
    run_id = run_line.split()[0]
    assert "completed" in run_line
    code, shown, _ = await parley("--config", str(config), "runs", "show", run_id[:8], env=env)
    assert code == 0
    for event in ("agent_run.started", "agent_run.reconcile", "agent.tool.call"):
        assert event in shown
    assert "agent_run.completed" in shown


async def test_sigkill_during_a_non_idempotent_tool_waits_on_a_human(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config, env = await _crash_during_second_tool(fake_llm, tmp_path, "write")
    out, _ = await _resume(config, env)
    assert "can't safely resume" in out
    assert "`wait_for_go`" in out
    assert len(fake_llm.requests) == 1  # nothing more was asked of the model
    _code, listing, _ = await parley("--config", str(config), "runs", env=env)
    assert "waiting_on_human" in listing
