"""The audit log's rows, their hash chain and their SQL, written once for both backends
(docs/governance.md#the-audit-log).

Each row's `hash` is SHA-256 over the previous row's hash and the row's own content, in
one canonical JSON form; the first row's `prev` is "". The `audit_head` table's one row
holds the last row's number and hash: an append reads it under a lock that serializes the
chain (SQLite's write lock; `SELECT … FOR UPDATE` on PostgreSQL), inserts the row and
moves the head, all in one transaction — a process killed at any point leaves either the
whole row or none of it. The head also shows a removed last row, which the chain alone
could not; triggers keep it like the rows (it only moves to the row appended after it),
and a missing head fails verification. A log cut back with its head moved back is only
caught by a head kept outside the store (`check_anchor`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from core.records import record


@record(frozen=True, slots=True)
class AuditRow:
    """One entry of the audit log.

    Attributes:
        seq: its number: 1, 2, 3 … with no gaps.
        at: when it was appended (seconds since the epoch).
        kind: what happened (`approval.asked`, `tool.refused`, `command`, …).
        actor: who did it (`slack:U012…`, `console`, `parley`).
        conv: the conversation it happened in ("" for none).
        detail: what exactly (the command, the tool and its arguments, the role needed).
        prev: the previous row's hash ("" for the first row).
        hash: SHA-256 over `prev` and this row's content (`chain_hash`).
    """

    seq: int
    at: float
    kind: str
    actor: str
    conv: str
    detail: dict[str, Any]
    prev: str
    hash: str


def canonical(detail: dict[str, Any]) -> str:
    """`detail` as the one JSON text it is stored and hashed as (sorted keys, no spaces;
    values that are not JSON become strings)."""
    return json.dumps(
        detail, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )


def chain_hash(
    prev: str, seq: int, at: float, kind: str, actor: str, conv: str, detail: str
) -> str:
    """The hash of a row: its content (`detail` in its canonical text) after `prev`."""
    body = json.dumps([prev, seq, repr(float(at)), kind, actor, conv, detail], ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def audit_row(row: Sequence[Any]) -> AuditRow:
    """A row of `SELECT {COLUMNS}`."""
    seq, at, kind, actor, conv, detail, prev, digest = row
    return AuditRow(int(seq), float(at), kind, actor, conv, json.loads(detail), prev, digest)


COLUMNS = "seq, at, kind, actor, conv, detail, prev, hash"
INSERT = f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
MOVE_HEAD = "UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1"
HEAD = "SELECT seq, hash FROM audit_head WHERE id = 1"
SELECT_SINCE = f"SELECT {COLUMNS} FROM audit_log WHERE at >= ? AND seq > ? ORDER BY seq LIMIT ?"


@record(frozen=True, slots=True)
class Problem:
    """The first place where the log is not what was appended."""

    seq: int
    what: str  # "changed" | "removed" | "added" (a row the head never moved to)
    text: str


def verify_chain(rows: Sequence[AuditRow], head: tuple[int, str] | None) -> Problem | None:
    """Recompute the chain of `rows` (the whole log, in order) against the `head`; the
    first row that was changed, removed or added past the head, or None if the log is
    whole. A migrated store always has its head row: without it, nothing vouches for the
    log's end, so a missing head is a problem even with no rows."""
    prev, expected = "", 1
    for row in rows:
        if row.seq != expected:
            return Problem(expected, "removed", f"row {expected} was removed (next is {row.seq})")
        digest = chain_hash(
            prev, row.seq, row.at, row.kind, row.actor, row.conv, canonical(row.detail)
        )
        if row.prev != prev:
            return Problem(row.seq, "removed", f"row {row.seq} does not follow row {row.seq - 1}")
        if digest != row.hash:
            return Problem(
                row.seq, "changed", f"row {row.seq} was changed (its hash does not match)"
            )
        prev, expected = row.hash, expected + 1
    return _against_head(expected - 1, prev, head)


def _against_head(last: int, last_hash: str, head: tuple[int, str] | None) -> Problem | None:
    """Whether the log's last row (`last`, 0 for none) is the one its head names."""
    if head is None:
        after = f"rows after {last}" if last else "every row"
        return Problem(
            last + 1, "removed", f"the head row was removed; {after} may have been removed with it"
        )
    if head[0] > last:
        return Problem(
            last + 1,
            "removed",
            f"row {last + 1} was removed (the log ends at {last}, its head at {head[0]})",
        )
    if head[0] < last:
        return Problem(
            head[0] + 1,
            "added",
            f"row {head[0] + 1} was added outside an append (the head is at {head[0]})",
        )
    if head[1] != last_hash:
        return Problem(last, "changed", f"row {last} was changed (it does not match the head)")
    return None


def check_anchor(rows: Sequence[AuditRow], anchor: tuple[int, str]) -> Problem | None:
    """Whether row `anchor[0]` is still the row whose hash began with `anchor[1]` when
    an earlier `--verify` printed it (kept outside the store): a log cut back to an
    earlier row, with its head moved back, verifies on its own but fails this."""
    seq, prefix = anchor
    row = rows[seq - 1] if 0 < seq <= len(rows) and rows[seq - 1].seq == seq else None
    if row is None:
        ends = f"the log ends at {len(rows)}"
        return Problem(seq, "removed", f"row {seq} was removed ({ends}; the anchor names it)")
    if not row.hash.startswith(prefix.lower()):
        return Problem(seq, "changed", f"row {seq} is not the row the anchor names")
    return None


__all__ = [
    "AuditRow",
    "Problem",
    "audit_row",
    "canonical",
    "chain_hash",
    "check_anchor",
    "verify_chain",
]
