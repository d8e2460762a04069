"""The subprocess runner: exit code and streams, artifacts, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from core.errors import ToolError
from core.sandbox.process import ProcessResult, run_process
from tests.helpers import wait_dead

# --- run_process -------------------------------------------------------------------------


async def run(
    argv: list[str], tmp_path: Path, *, timeout: float = 5, cap: int = 1024
) -> ProcessResult:
    return await run_process(
        argv,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "ONLY": "this"},
        timeout=timeout,
        cap=cap,
        artifacts_dir=tmp_path / "artifacts",
    )


async def test_run_process_reports_exit_code_streams_and_env(tmp_path: Path) -> None:
    result = await run(["bash", "-c", "pwd; echo $ONLY; cat; echo bad >&2; exit 3"], tmp_path)
    assert result.exit_code == 3
    assert result.stdout == f"{tmp_path}\nthis\n"  # `cat` got EOF: stdin is closed
    assert result.stderr == "bad\n"
    assert not result.timed_out
    assert not result.truncated
    assert result.artifact is None
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_run_process_keeps_full_output_in_artifact(tmp_path: Path) -> None:
    result = await run(["seq", "1", "100000"], tmp_path, cap=4096)
    expected = "".join(f"{n}\n" for n in range(1, 100_001))
    assert result.truncated
    assert result.artifact is not None
    assert result.artifact.read_text() == expected
    assert result.stdout.startswith("1\n2\n")
    assert result.stdout.endswith("99999\n100000\n")
    assert len(result.stdout.encode()) < 4096 + 200
    assert result.artifact.parent == tmp_path / "artifacts"


async def test_run_process_missing_program_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot start `no-such-program-xyz`"):
        await run(["no-such-program-xyz"], tmp_path)


async def test_run_process_timeout_kills_group(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; sleep 30"
    started = time.monotonic()
    result = await run(["bash", "-c", script], tmp_path, timeout=0.3)
    assert time.monotonic() - started < 2
    assert result.timed_out
    assert result.exit_code == -9
    assert wait_dead([int((tmp_path / "child.pid").read_text())]) == []


async def test_background_child_holding_pipes_does_not_stall(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; echo done"
    started = time.monotonic()
    result = await run(["bash", "-c", script], tmp_path, timeout=10)
    assert time.monotonic() - started < 2
    assert result.exit_code == 0
    assert result.stdout == "done\n"
    assert result.lingering_killed
    assert not result.timed_out
    assert wait_dead([int((tmp_path / "child.pid").read_text())]) == []


async def test_cancelling_run_process_kills_group(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; echo $$ > parent.pid; wait"
    task = asyncio.create_task(run(["bash", "-c", script], tmp_path, timeout=30))
    deadline = time.monotonic() + 5
    while not (tmp_path / "parent.pid").exists() or not (tmp_path / "child.pid").exists():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # let both writes land
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pids = [int((tmp_path / f).read_text()) for f in ("child.pid", "parent.pid")]
    assert wait_dead(pids) == []
    assert asyncio.all_tasks() == {asyncio.current_task()}
