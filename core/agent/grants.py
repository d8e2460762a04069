"""Durable approvals ("approve always") and `/grants` (docs/tools.md#approvals).

An approver who answers an approval prompt with "Always here" or "Always in this channel"
stores a grant: from then on that tool runs without asking in that conversation, or in
every conversation of that channel. Only a call of the tool's own category is covered:
one escalated for what it does (a destructive `bash` command) asks every time. Cron jobs
and child runs never ask anyone, so grants do not reach them. `/grants` lists the grants
that hold in a conversation; `/grants revoke ID` removes one (anyone who may talk to
Parley may take a permission back; only approvers give one).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid

from core.chat import GrantScope
from core.eventlog import EventLog
from core.run_context import Auditor
from core.store import GrantRow, Store

USAGE = "Usage: /grants, or /grants revoke ID"


def grant_keys(conv: str) -> tuple[str, str]:
    """The keys a grant in conversation `conv` is stored under: the conversation's own,
    and its channel's (`slack:C0123:1700.1` → `slack:C0123`)."""
    return conv, ":".join(conv.split(":", 2)[:2])


def new_grant(conv: str, tool: str, scope: GrantScope, by: str) -> GrantRow:
    """A grant of `tool` in conversation `conv` (or its channel), given by `by`."""
    conversation, channel = grant_keys(conv)
    key = conversation if scope == "conversation" else channel
    return GrantRow(uuid.uuid4().hex[:8], scope, key, tool, by, time.time())


def _line(grant: GrantRow) -> str:
    where = "this conversation" if grant.scope == "conversation" else "this channel"
    day = dt.datetime.fromtimestamp(grant.granted_at, dt.UTC).date().isoformat()
    return f"{grant.id}  {grant.tool} — {where}; by {grant.granted_by} on {day}"


async def grants_command(
    store: Store,
    events: EventLog,
    conv: str,
    args: str,
    audit: Auditor | None = None,
    actor: str = "",
) -> str:
    """`/grants [revoke ID]` in conversation `conv`; a revocation by `actor` goes to
    `audit`."""
    keys = grant_keys(conv)
    words = args.split()
    if words and (words[0] != "revoke" or len(words) != 2):
        return USAGE
    if words:
        revoked = await store.revoke_grant(words[1], keys)
        if revoked is None:
            return f"No grant {words[1]} here; /grants lists them."
        data = {"tool": revoked.tool, "scope": revoked.scope, "key": revoked.key}
        events.emit("agent.grant.revoked", data, conv=conv)
        if audit is not None:
            audit.record("grant.revoked", actor, {**data, "grant": revoked.id}, conv=conv)
        return f"Revoked: {revoked.tool} asks an approver again here."
    grants = await store.grants(keys)
    if not grants:
        return 'No tool runs without asking here. An approver\'s "Always" answer adds one.'
    lines = [_line(g) for g in grants]
    return "\n".join(["Approved always here:", *lines, "Revoke one with /grants revoke ID."])


__all__ = ["grant_keys", "grants_command", "new_grant"]
