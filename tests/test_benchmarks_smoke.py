"""The benchmarks still run (numbers are read by people, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_loop_overhead_quick_run_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "loop.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/loop_overhead.py", "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "| 20 |" in result.stdout
    assert "per-iteration overhead ratio" in result.stdout
    assert out.exists()
