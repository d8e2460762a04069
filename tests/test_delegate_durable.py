"""Delegation survives a crash (docs/delegation-memory.md): `parley chat` is killed with SIGKILL
while one
child run has finished and its sibling is inside a side-effecting tool. After the restart
`/resume` replays the finished child from the store and halts the other to
`waiting_on_human`: no child is run again, no side effect happens twice."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path

from tests.delegatekit import Scripts, delegate
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.process import child_env, parley, start_parley, write_config

TOOLS_YAML = """
tools:
  - name: wait_for_go
    description: "Wait until the file go exists."
    category: write
    cmd: sh
    args: ["-c", "echo waited >> waits.txt; while [ ! -f go ]; do sleep 0.05; done; echo ready"]
    timeout: 60
    parameters: {}
"""


def _query(db: Path, sql: str) -> list[tuple[object, ...]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []


async def _crash_mid_delegation(fake_llm: FakeLLM, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML)
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.append(Reply(tool_calls=[delegate("alpha: write", "beta: wait", call_id="d1")]))
    effect = ToolCallSpec("bash", {"command": "echo alpha >> effects.txt"}, id="a1")
    scripts.child("alpha", Reply(tool_calls=[effect]), Reply(text="alpha wrote the file"))
    scripts.child("beta", Reply(tool_calls=[ToolCallSpec("wait_for_go", {}, id="b1")]))
    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdin is not None
    proc.stdin.write(b"split the work\n")
    await proc.stdin.drain()
    db = tmp_path / "parley.db"
    async with asyncio.timeout(30):
        while not (
            _query(db, "SELECT 1 FROM tool_calls WHERE call_id = 'b1'")
            and _query(db, "SELECT 1 FROM runs WHERE trigger = 'child' AND state = 'completed'")
        ):
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    (tmp_path / "ws" / "go").touch()  # lets the orphaned tool process end
    fake_llm.responder = None
    return config, env


async def test_sigkill_mid_delegation_then_resume_replays_finished_children(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config, env = await _crash_mid_delegation(fake_llm, tmp_path)
    before = len(fake_llm.requests)
    fake_llm.script(Reply(text="all finished"))
    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdout is not None
    assert proc.stdin is not None
    async with asyncio.timeout(30):
        hint = (await proc.stdout.readline()).decode()
    assert "interrupted" in hint
    proc.stdin.write(b"/resume\n")
    await proc.stdin.drain()
    out, err = await asyncio.wait_for(proc.communicate(b"/exit\n"), 30)
    assert proc.returncode == 0, err
    assert "all finished" in out.decode()
    assert "interrupted" not in out.decode()  # only the parent was announced, not its children
    # After the restart only the parent asked the model: neither child ran again.
    assert len(fake_llm.requests) == before + 1
    ws = tmp_path / "ws"
    assert (ws / "effects.txt").read_text() == "alpha\n"
    assert (ws / "waits.txt").read_text() == "waited\n"
    results = {
        m["tool_call_id"]: m["content"]
        for m in fake_llm.requests[-1].json["messages"]
        if m["role"] == "tool"
    }
    result = results["d1"]
    assert "1 completed, 1 waiting_on_human" in result
    assert "alpha wrote the file" in result
    assert "taken from the store" in result
    assert "`wait_for_go` had started but not finished" in result
    db = tmp_path / "parley.db"
    parent = _query(db, "SELECT id, state FROM runs WHERE parent_run_id IS NULL")
    assert [state for _id, state in parent] == ["completed"]
    children = _query(db, f"SELECT state FROM runs WHERE parent_run_id = '{parent[0][0]}'")
    assert sorted(state for (state,) in children) == ["completed", "waiting_on_human"]
    await _runs_show_parent_and_children(config, env, str(parent[0][0]))


async def _runs_show_parent_and_children(config: Path, env: dict[str, str], parent: str) -> None:
    code, listing, _ = await parley("--config", str(config), "runs", env=env)
    assert code == 0
    lines = listing.splitlines()
    assert lines[1].startswith(parent)  # the parent first, its children indented under it
    assert lines[2].lstrip().startswith("↳")
    assert lines[3].lstrip().startswith("↳")
    code, shown, _ = await parley("--config", str(config), "runs", "show", parent, env=env)
    assert code == 0
    assert "Children (2):" in shown
    assert "waiting_on_human" in shown
    assert "agent.delegate.started" in shown
    child = lines[2].split()[1]
    code, shown, _ = await parley("--config", str(config), "runs", "show", child, env=env)
    assert code == 0
    assert f"Parent run: {parent}" in shown
