"""The `bash` blocklist's verdicts: what Parley does with a command, and why."""

from __future__ import annotations

from typing import Literal

from core.records import record

VerdictKind = Literal["ok", "destructive", "blocked", "interactive"]

_RANK: dict[VerdictKind, int] = {"ok": 0, "destructive": 1, "interactive": 2, "blocked": 3}
_UNREADABLE = "Parley cannot check it, so an approver must"


@record(frozen=True, slots=True)
class BlockVerdict:
    """How `bash` must treat a command, and why (phrased for the model)."""

    kind: VerdictKind
    reason: str = ""


OK = BlockVerdict("ok")


def worst(verdicts: list[BlockVerdict]) -> BlockVerdict:
    """The verdict that ranks highest (blocked > interactive > destructive > ok)."""
    return max(verdicts, key=lambda v: _RANK[v.kind], default=OK)


def unreadable(what: str) -> BlockVerdict:
    """Parley cannot tell what `what` runs: fail closed, and let an approver decide."""
    return BlockVerdict("destructive", f"{what}; {_UNREADABLE}")
