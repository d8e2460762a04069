"""Several processes on one store, as several `parley run` workers are (docs/scale-out.md): they
open it at once on new data (so they migrate it at once), then race to claim the same
fires of a job (each fire has exactly one winner), or to take queued runs (each run is
taken once, and a conversation's runs one after the other, in order)."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.store import open_store
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
WORKER = """
import asyncio, sys
from core.store import open_store

async def main() -> None:
    store = await open_store(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    while True:
        run = await store.claim_queued_run(sys.argv[2])
        if run is None:
            if not await store.runs(states=["queued"], limit=1):
                break
            await asyncio.sleep(0.001)
            continue
        await asyncio.sleep(0.01)  # the run's work: the others claim meanwhile
        store.set_run_state(run.id, "completed", "done")
        await store.flush()
    await store.aclose()

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
    outputs = await race(
        [[CLAIMER, target, str(FIRES), str(FIRES * n // PROCESSES)] for n in range(PROCESSES)]
    )
    won = [json.loads(out) for out in outputs]
    assert sorted(f for fires in won for f in fires) == list(range(FIRES))
    assert len([w for w in won if w]) >= 2, f"the processes did not race: {won}"


async def test_processes_take_each_queued_run_once_and_a_conversation_in_order(
    target: str,
) -> None:
    created: dict[str, list[str]] = {}
    async with await open_store(target) as store:
        for n in range(6):
            for conv in ("a", "b", "c", "d"):
                await store.create_run(f"{conv}-{n}", conv, "user", state="queued")
                created.setdefault(conv, []).append(f"{conv}-{n}")
    await race([[WORKER, target, f"w{n}"] for n in range(PROCESSES)])
    async with await open_store(target) as store:
        runs = await store.runs(limit=100)
    assert {r.state for r in runs} == {"completed"}
    for conv, ids in created.items():
        mine = sorted((r for r in runs if r.conv == conv), key=lambda r: r.started_at or 0)
        assert [r.id for r in mine] == ids
        for earlier, later in itertools.pairwise(mine):
            assert earlier.ended_at is not None
            assert later.started_at is not None
            assert earlier.ended_at <= later.started_at, f"{earlier.id} and {later.id} overlap"
    assert len({r.worker for r in runs}) >= 2, "the processes did not race"


async def race(commands: list[list[str]]) -> list[str]:
    """Run `python -c CODE ARGS…` for each command; once all are open (each prints
    `ready`), let them go at once; their outputs."""
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
            cwd=REPO,
        )
        for command in commands
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
    assert [child.returncode for child in children] == [0] * len(children), outputs
    return [out.decode() for out, _ in outputs]
