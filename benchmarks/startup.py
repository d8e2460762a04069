"""Start-up time of `parley --version`, peak RSS of one `parley chat -m` turn, `parley run`
from exec to "ready" with the terminal channel only, and the floor under the CLI's
start-up: what the required libraries alone take to import.

`parley run` is timed from the spawn to its `parley: ready` line (the store opened and
migrated, the agent reconciled, the console listening; HOME is a fresh directory each
time, so the store is a new file), then its standard input is closed and it exits. Its
goal is at most 1.5× the dependency floor's import time (docs/benchmarks.md): the two run
back to back, the order alternating, and the ratio is the median of the rounds' ratios.

Run from the repo root: `.venv/bin/python benchmarks/startup.py`. The turn runs against the
fake LLM on 127.0.0.1 and calls two real tools (bash, list_directory). Peak RSS is the
child's own `ru_maxrss`, read with `os.wait4`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec  # noqa: E402

PARLEY = [sys.executable, "-m", "bot"]


# What any process must import to do what `parley chat -m` does with the libraries the
# design card fixes (config and tool arguments: pydantic; tools.yaml: PyYAML; the turn:
# httpx2 over httpcore2/anyio), and one pydantic model built: the floor under Parley's own
# start-up. Beside it, the raw loop's imports (the bench's baseline CLI).
FLOOR = (
    "import asyncio, tomllib, httpx2, httpcore2, anyio, pydantic, yaml\n"
    "class M(pydantic.BaseModel):\n    a: int = 1\nM()"
)
RAW_LOOP = "import asyncio, httpx"
ROUNDS = 9  # `parley run` and the floor, back to back


def median_seconds(argv: list[str], runs: int = 7) -> float:
    return statistics.median(once_seconds(argv) for _ in range(runs))


async def turn_peak_rss_mb() -> tuple[float, float]:
    async with FakeLLM() as fake:
        fake.script(
            Reply(
                tool_calls=[
                    ToolCallSpec("bash", {"command": "echo hi"}),
                    ToolCallSpec("list_directory", {"path": "."}),
                ]
            ),
            Reply(text="done"),
        )
        home = tempfile.mkdtemp()
        env = dict(os.environ, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="k", HOME=home)
        start = time.perf_counter()
        # Popen, not asyncio's subprocess: os.wait4 on its pid gives this child's own rusage.
        proc = subprocess.Popen(  # noqa: ASYNC220
            [*PARLEY, "--config", str(REPO / "config.toml"), "chat", "-m", "hi"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = await asyncio.get_running_loop().run_in_executor(
            None, os.wait4, proc.pid, 0
        )
        elapsed = time.perf_counter() - start
        if status != 0:
            raise SystemExit(f"parley chat -m failed with status {status}")
        return usage.ru_maxrss / 1024, elapsed


async def ready_seconds(fake: FakeLLM) -> float:
    """Seconds from spawning `parley run` (no channel enabled: the terminal console) to its
    `parley: ready` line."""
    home = tempfile.mkdtemp()
    env = dict(os.environ, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="k", HOME=home)
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *PARLEY,
        "--config",
        str(REPO / "config.toml"),
        "run",
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    assert proc.stdin is not None
    seen = []
    while line := await asyncio.wait_for(proc.stderr.readline(), 60):
        seen.append(line.decode())
        if b"parley: ready" in line:  # after the console's prompt, on its line
            elapsed = time.perf_counter() - start
            break
    else:
        raise SystemExit("parley run never said it was ready:\n" + "".join(seen))
    proc.stdin.close()  # the console closes: parley stops
    await proc.stderr.read()
    await asyncio.wait_for(proc.wait(), 60)
    return elapsed


def once_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


async def ready_against_floor(rounds: int = ROUNDS) -> tuple[float, float, list[float]]:
    """`parley run`'s exec-to-ready and the floor's imports, run back to back `rounds`
    times, the order alternating (as the shared bench takes its ratios: a slow stretch of
    a noisy machine then falls on both sides of a round, not on one side's whole series).
    Returns the two medians and each round's ratio."""
    ready, floor, ratios = [], [], []
    async with FakeLLM() as fake:  # the provider probe at start-up connects to it
        for index in range(rounds):
            if index % 2:
                r = await ready_seconds(fake)
                f = once_seconds([sys.executable, "-c", FLOOR])
            else:
                f = once_seconds([sys.executable, "-c", FLOOR])
                r = await ready_seconds(fake)
            ready.append(r)
            floor.append(f)
            ratios.append(r / f)
    return statistics.median(ready), statistics.median(floor), ratios


def compile_sources() -> None:
    """Byte-compile Parley's packages, as its first run leaves them for every later one
    (`__pycache__`). Without it, an environment with PYTHONDONTWRITEBYTECODE set (as some
    shells and CI images have) makes every timed start compile ~160 modules from source
    (~0.2 s here) while the floor's libraries load the bytecode pip wrote at install."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "bot", "core", "channels"],
        cwd=REPO,
        check=True,
    )


def main() -> None:
    compile_sources()
    version = median_seconds([*PARLEY, "--version"])
    ready, floor, ratios = asyncio.run(ready_against_floor())
    raw = median_seconds([sys.executable, "-c", RAW_LOOP])
    rss, elapsed = asyncio.run(turn_peak_rss_mb())
    print("| measure | value | goal |")
    print("|---|---|---|")
    print(f"| `parley --version` (median of 7) | {version * 1000:.0f} ms | < 500 ms |")
    print(f"| `parley chat -m` turn with 2 tools: peak RSS | {rss:.1f} MB | < 80 MB |")
    print(f"| `parley chat -m` turn with 2 tools: wall time | {elapsed * 1000:.0f} ms | — |")
    print(f"| imports of the raw loop (asyncio, httpx) | {raw * 1000:.0f} ms | — |")
    print(f"| dependency floor: the libraries' imports, one model | {floor * 1000:.0f} ms | — |")
    spread = f"{min(ratios):.2f}–{max(ratios):.2f}"
    print(
        f"| `parley run` (terminal only): exec to ready (median of {ROUNDS}) "
        f"| {ready * 1000:.0f} ms; median of the rounds' ratios "
        f"{statistics.median(ratios):.2f}× the floor [{spread}] | ≤ 1.5× |"
    )


if __name__ == "__main__":
    main()
