"""Durable approvals ("approve always"): a tool that runs without asking in one
conversation or one channel, as an approver chose. The rows and their SQL, written once
for both backends (`?` or `%s` placeholders)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.chat import GrantScope
from core.records import record

GRANT_COLUMNS = "id, scope, key, tool, granted_by, granted_at"


@record(frozen=True, slots=True)
class GrantRow:
    """`tool` runs without asking in `key`: a conversation id (`slack:C0123:1700.1`) or,
    for a channel, its first two parts (`slack:C0123`)."""

    id: str
    scope: GrantScope
    key: str
    tool: str
    granted_by: str
    granted_at: float


def grant_row(row: Sequence[Any]) -> GrantRow:
    scope: GrantScope = "channel" if row[1] == "channel" else "conversation"
    return GrantRow(str(row[0]), scope, str(row[2]), str(row[3]), str(row[4]), float(row[5]))


def insert_grant(placeholder: str) -> str:
    """One grant per (key, tool): granting again keeps the first."""
    values = ", ".join([placeholder] * 6)
    return (
        f"INSERT INTO grants ({GRANT_COLUMNS}) VALUES ({values}) ON CONFLICT (key, tool) DO NOTHING"
    )


def select_grants(placeholder: str, keys: int) -> str:
    marks = ", ".join([placeholder] * keys)
    return f"SELECT {GRANT_COLUMNS} FROM grants WHERE key IN ({marks}) ORDER BY granted_at, id"


def delete_grant(placeholder: str) -> str:
    return f"DELETE FROM grants WHERE id = {placeholder}"


__all__ = ["GRANT_COLUMNS", "GrantRow", "GrantScope", "grant_row"]
