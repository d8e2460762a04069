"""The benchmarks still run (numbers are read by people, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("loop_overhead.py", ["| 20 |", "per-iteration overhead ratio"]),
        ("context.py", ["| 5,000 |", "R1 compaction"]),
        ("compaction.py", ["| summary |", "| subgoal |", "| subgoal_mig |", "| focus |"]),
        ("concurrency.py", ["| ratio Parley/raw |", "throughput at 0 ms", "p99 at 200 ms"]),
        ("relay.py", ["| telegram |", "| slack |", "| discord |", "max edits in window"]),
        (
            "memory.py",
            [
                "| SQLite (FTS5) | 200 |",
                "recall@5",
                "results from other scopes",
                "| 100 KB message 1 |",
            ],
        ),
        ("redaction.py", ["| tool output |", "scrub µs per iteration"]),
        ("tool_search.py", ["| search on: first request |", "under the 12 KB goal"]),
        ("caching.py", ["| openai_chat |", "| anthropic |", "of the previous request"]),
        ("triggers.py", ["deliveries accepted per second", "2xx to first post", "| SQLite |"]),
    ],
)
def test_quick_run_prints_the_tables(tmp_path: Path, script: str, expected: list[str]) -> None:
    out = tmp_path / "numbers.json"
    args = ["--quick", "--json", str(out)] if script == "loop_overhead.py" else ["--quick"]
    result = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for text in expected:
        assert text in result.stdout
    if script == "loop_overhead.py":
        assert out.exists()
