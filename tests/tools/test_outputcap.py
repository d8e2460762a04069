"""Output caps: head and tail kept, the cut named, characters never split."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from core.sandbox.outputcap import cap_output

# --- cap_output --------------------------------------------------------------------------


def test_cap_output_keeps_short_output_whole() -> None:
    assert cap_output(b"hello\n", 1024) == ("hello\n", False, 0)


def test_cap_output_keeps_head_and_tail_with_notice(tmp_path: Path) -> None:
    data = b"H" * 600 + b"M" * 12_345 + b"T" * 600
    text, truncated, cut = cap_output(data, 1024, tmp_path / "full.txt")
    assert truncated
    assert cut == len(data) - 1024
    assert text.startswith("H" * 512)
    assert text.endswith("T" * 512)
    assert f"\n…[{cut:,} bytes cut; full output in {tmp_path / 'full.txt'}]…\n" in text


def test_cap_output_does_not_split_characters() -> None:
    text, truncated, _ = cap_output("é".encode() * 2000, 1025)
    assert truncated
    assert "\ufffd" not in text


@given(st.binary(max_size=5000), st.integers(min_value=16, max_value=3000))
def test_cap_output_is_bounded(data: bytes, cap: int) -> None:
    text, truncated, cut = cap_output(data, cap)
    assert truncated == (len(data) > cap)
    assert cut == max(0, len(data) - cap)
    notice = len("\n…[ bytes cut; full output not kept]…\n") + len(f"{cut:,}")
    assert len(text) <= cap + (notice if truncated else 0)
