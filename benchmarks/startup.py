"""Start-up time of `parley --version` and peak RSS of one `parley chat -m` turn.

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


def version_seconds(runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([*PARLEY, "--version"], cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def main() -> None:
    version = version_seconds()
    rss, elapsed = asyncio.run(turn_peak_rss_mb())
    print("| measure | value | goal |")
    print("|---|---|---|")
    print(f"| `parley --version` (median of 7) | {version * 1000:.0f} ms | < 500 ms |")
    print(f"| `parley chat -m` turn with 2 tools: peak RSS | {rss:.1f} MB | < 80 MB |")
    print(f"| `parley chat -m` turn with 2 tools: wall time | {elapsed * 1000:.0f} ms | — |")


if __name__ == "__main__":
    main()
