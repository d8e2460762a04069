"""The store's part about people (docs/governance.md): the tools an approver let run
without asking (grants), the audit log, and who sent each queued run's message. Part of
`core.store.protocol.Store`; every backend implements it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.store.audit_rows import AuditRow
from core.store.grant_rows import GrantRow


class GrantStore(Protocol):
    """Durable approvals: a tool an approver let run without asking in a conversation or a
    channel ("approve always"), listed and revoked with `/grants`."""

    def add_grant(self, row: GrantRow) -> None:
        """Queued: the grant; one per (key, tool), a second keeps the first."""
        ...

    async def grants(self, keys: Sequence[str]) -> list[GrantRow]:
        """The grants of those conversation or channel keys, oldest first."""
        ...

    async def revoke_grant(self, grant_id: str, keys: Sequence[str]) -> GrantRow | None:
        """Committed: remove grant `grant_id` if it belongs to one of `keys`; the grant, or
        None if there was none."""
        ...


class AuditStore(Protocol):
    """The audit log (docs/governance.md#the-audit-log): append-only and hash-chained."""

    async def append_audit(self, kind: str, actor: str, conv: str, detail: str) -> AuditRow:
        """Committed: one row after the last, `detail` being its canonical JSON text
        (`audit_rows.canonical`); its number and hash. Appends of several processes
        follow one another: each holds the chain's lock (SQLite's write lock, PostgreSQL's
        row lock on the head) from reading the head to moving it, in one transaction."""
        ...

    async def audit_rows(
        self, *, since: float = 0.0, after: int = 0, limit: int = 1000
    ) -> list[AuditRow]:
        """Up to `limit` rows numbered above `after` and appended at or after `since`, in
        order."""
        ...

    async def audit_head(self) -> tuple[int, str] | None:
        """The last row's number and hash as the head records them ((0, "") when empty)."""
        ...


class RunSenderStore(Protocol):
    """Who sent a queued run's message (docs/governance.md#roles): the worker that claims
    the run decides its role from it."""

    def add_sender(self, run_id: str, user_id: str, user_name: str, groups: Sequence[str]) -> None:
        """Queued (so committed before a run created after it): run `run_id`'s sender."""
        ...

    async def sender(self, run_id: str) -> tuple[str, str, tuple[str, ...]] | None:
        """The sender's user id, name and platform groups, or None if none was stored."""
        ...


__all__ = ["AuditStore", "GrantStore", "RunSenderStore"]
