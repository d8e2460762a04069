"""Output caps (docs/tools.md): a tool's output beyond the cap is cut to its head and tail,
with a notice naming the artifact that keeps it whole."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import BinaryIO, Protocol


class ArtifactBudget(Protocol):
    """Where an artifact's bytes come from (a call's write quota)."""

    def take(self, n: int) -> int:
        """How many of `n` more bytes may be written (0..n)."""


def _decode_head(data: bytes) -> str:
    # An incremental decoder without `final` drops a multi-byte character cut in half.
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def _decode_tail(data: bytes) -> str:
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:  # continuation bytes
        skip += 1
    return data[skip:].decode("utf-8", errors="replace")


def cut_notice(cut: int, artifact: Path | None, kept: int | None = None) -> str:
    """The marker put where output was cut; `kept`: the artifact holds only the first
    `kept` bytes (the write quota stopped it)."""
    if artifact is None:
        where = "full output not kept" if kept is None else "not kept: write quota reached"
    elif kept is None:
        where = f"full output in {artifact}"
    else:
        where = f"first {kept:,} bytes in {artifact}; the rest not kept: write quota reached"
    return f"\n…[{cut:,} bytes cut; {where}]…\n"


def _join_cut(
    head: bytes, tail: bytes, cut: int, artifact: Path | None, kept: int | None = None
) -> str:
    return _decode_head(head) + cut_notice(cut, artifact, kept) + _decode_tail(tail)


def cap_output(data: bytes, cap: int, artifact: Path | None = None) -> tuple[str, bool, int]:
    """Decode `data`, keeping head and tail (half of `cap` each) when it is longer.

    Returns:
        (text, truncated, bytes_cut); the notice names `artifact` when given.
    """
    if len(data) <= cap:
        return data.decode("utf-8", errors="replace"), False, 0
    half = cap // 2
    tail = cap - half
    cut = len(data) - half - tail
    return _join_cut(data[:half], data[-tail:], cut, artifact), True, cut


class CappedStream:
    """Keeps the first and the last cap/2 bytes of a stream in memory; once the stream
    exceeds the cap, everything is also written to an artifact file, as far as `budget`
    (the call's write quota) allows."""

    def __init__(self, cap: int, artifact: Path, budget: ArtifactBudget | None = None) -> None:
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0
        self._artifact_path = artifact
        self._file: BinaryIO | None = None
        self._budget = budget
        self._kept: int | None = None  # bytes in the artifact once the budget ran out

    def _write(self, data: bytes) -> None:
        """Write what the budget allows of `data`; after a refusal, nothing more."""
        if self._kept is not None:
            return
        granted = len(data) if self._budget is None else self._budget.take(len(data))
        if granted and self._file is None:
            self._artifact_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self._artifact_path.open("wb")
        if self._file is not None:
            # Small sequential writes to local disk; not worth a thread hop per chunk.
            self._file.write(data[:granted] if granted < len(data) else data)
        if granted < len(data):
            self._kept = self._file.tell() if self._file is not None else 0

    def feed(self, data: bytes) -> None:
        if self._total + len(data) > self._head_cap + self._tail_cap:
            if self._file is None and self._kept is None:
                # Nothing has been dropped yet, so head + tail is everything read so far.
                self._write(bytes(self._head + self._tail))
            self._write(data)
        self._total += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        if len(self._tail) > self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def result(self) -> tuple[str, Path | None]:
        cut = self._total - len(self._head) - len(self._tail)
        if cut == 0:
            return (self._head + self._tail).decode("utf-8", errors="replace"), None
        artifact = self._artifact_path if self._file is not None else None
        text = _join_cut(bytes(self._head), bytes(self._tail), cut, artifact, self._kept)
        return text, artifact
