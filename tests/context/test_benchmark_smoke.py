"""benchmarks/context.py still runs (numbers are read by people, not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_context_benchmark_quick_run_prints_the_tables() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/context.py", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "| 5,000 |" in result.stdout
    assert "R1 compaction" in result.stdout
