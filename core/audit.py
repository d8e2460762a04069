"""The audit log (docs/governance.md#the-audit-log): what a security review asks about,
append-only and hash-chained in the store.

Kinds recorded (each row: kind, actor, conversation, detail):

    approval.asked / approval.granted / approval.denied   who, the tool and exact call
    approval.refused                                       a click by someone who may not
    grant.added / grant.revoked                            "approve always", `/grants`
    tool.refused                                           by policy or by role
    command / command.refused                              admin commands, and refusals
                                                           (by role or by the command)
    budget.refused / budget.changed                        (recorded by the budgets)
    config.reloaded / tools.reloaded                       what changed

`AuditLog.record(kind, actor, detail)` is the one call for all of them: it never raises
and never blocks its caller (the append runs in its own task; `flush` waits for those).
`await AuditLog.append(…)` is for a caller that must know the row is committed. What is
recorded is scrubbed of the configured secrets first (`core.secrets`), so the hash covers
what is stored.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from core.errors import StoreError
from core.secrets import scrub
from core.store import AuditRow, AuditStore
from core.store.audit_rows import Problem, canonical, check_anchor, verify_chain

log = logging.getLogger(__name__)

PAGE = 1000  # rows read at a time by `rows` and `verify`


class AuditLog:
    """Appends to the store's audit log."""

    def __init__(self, store: AuditStore | None) -> None:
        self.store = store
        self._pending: set[asyncio.Task[AuditRow | None]] = set()

    async def append(
        self, kind: str, actor: str, detail: dict[str, Any] | None = None, *, conv: str = ""
    ) -> AuditRow | None:
        """Append one row and wait for its commit; None if there is no store or the append
        failed (logged: an audit failure does not stop the action it records)."""
        if self.store is None:
            return None
        text = scrub(canonical(detail or {}))
        try:
            return await self.store.append_audit(kind, scrub(actor), conv, text)
        except StoreError:
            log.exception("audit: %s by %s not recorded", kind, actor)
            return None

    def budget_event(self, name: str, data: dict[str, Any]) -> None:
        """A budget refusal or change (`core.cost.meter.BudgetEvent`), recorded as `name`."""
        actor = str(data.get("by") or data.get("user") or data.get("job") or "parley")
        self.record(name, actor, data, conv=str(data.get("conv", "")))

    def record(
        self, kind: str, actor: str, detail: dict[str, Any] | None = None, *, conv: str = ""
    ) -> None:
        """Append one row in the background (see `flush`); safe to call from sync code
        running on the event loop. Without a running loop, nothing is recorded."""
        if self.store is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(
                self.append(kind, actor, detail, conv=conv), name=f"audit {kind}"
            )
        except RuntimeError:
            log.warning("audit: %s by %s outside the event loop; not recorded", kind, actor)
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for every row `record` started."""
        while self._pending:
            await asyncio.wait(set(self._pending))


async def read_rows(store: AuditStore, since: float = 0.0) -> list[AuditRow]:
    """Every row appended at or after `since`, in order."""
    rows: list[AuditRow] = []
    after = 0
    while page := await store.audit_rows(since=since, after=after, limit=PAGE):
        rows.extend(page)
        after = page[-1].seq
    return rows


async def verify(
    store: AuditStore, anchor: tuple[int, str] | None = None
) -> tuple[int, Problem | None]:
    """Recompute the whole chain: how many rows it has, and the first that was changed,
    removed or added outside an append (None if every row is as appended). `anchor`: a
    row number and a prefix of its hash, as an earlier `verify` left them, that must
    still be in the log."""
    rows = await read_rows(store)
    problem = verify_chain(rows, await store.audit_head())
    if problem is None and anchor is not None:
        problem = check_anchor(rows, anchor)
    return len(rows), problem


__all__ = ["AuditLog", "read_rows", "verify"]
