"""Several processes on one store, as several `parley run` workers are (SPEC §14): each
opens it at once on new data (so they migrate it at once), then they race to claim the
same fires of a job, each from another start; each fire has exactly one winner."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.process import REPO, child_env
from tests.store.conftest import postgres_schema

CLAIMER = """
import asyncio, json, sys
from core.store import open_store

async def main() -> None:
    store = await open_store(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()  # go: every process is open
    fires, start = int(sys.argv[2]), int(sys.argv[3])  # each process starts elsewhere
    won = []
    for fire in ((start + n) % fires for n in range(fires)):
        if await store.claim_job_fire("report", float(fire)) is not None:
            won.append(fire)
    await store.aclose()
    print(json.dumps(won), flush=True)

asyncio.run(main())
"""
FIRES = 150
PROCESSES = 3


@pytest.fixture(params=["sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """What `open_store` is given: a new SQLite file, or a URL of a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "parley.db")
    else:
        async with postgres_schema() as url:
            yield url


async def test_processes_opening_one_store_at_once_claim_each_fire_once(target: str) -> None:
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CLAIMER,
            target,
            str(FIRES),
            str(FIRES * n // PROCESSES),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=REPO,
        )
        for n in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line == b"ready\n", (line, await child.stderr.read() if child.stderr else b"")
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        outputs = [await asyncio.wait_for(child.communicate(), 60) for child in children]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    assert [child.returncode for child in children] == [0] * PROCESSES, outputs
    won = [json.loads(out) for out, _ in outputs]
    assert sorted(f for fires in won for f in fires) == list(range(FIRES))
    assert len([w for w in won if w]) >= 2, f"the processes did not race: {won}"
