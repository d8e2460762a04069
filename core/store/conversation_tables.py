"""The rest of `Store`, written once for both backends: conversations, their messages and
snapshots, journals, provider and instruction preferences, goals, the platform events
seen, approvals and the event log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from core.chat import PromptRef
from core.messages import Message
from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.rows import (
    APPROVAL_COLUMNS,
    GOAL_COLUMNS,
    ApprovalRow,
    ConversationRow,
    GoalRow,
    StoredEvent,
    approval_row,
    goal_row,
)
from core.store.run_tables import RunTables, owns_run


class ConversationSql:
    """The statements of `ConversationTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        q = d.sql
        up = d.upsert
        self.load_messages = q("SELECT body FROM messages WHERE conv = ? ORDER BY seq")
        self.message = up("messages", "conv, seq, body", "conv, seq")
        self.run_message = up("messages", "conv, seq, body", "conv, seq", where=owns_run(d))
        self.drop = q("DELETE FROM messages WHERE conv = ? AND seq >= ?")
        self.run_drop = self.drop + f" AND {owns_run(d)}"
        self.conversation = q(
            "SELECT key, input_tokens, output_tokens, last_compaction "
            "FROM conversations WHERE key = ?"
        )
        self.snapshot = up(
            "conversations", "key, input_tokens, output_tokens, last_compaction, updated_at", "key"
        )
        self.clear = [
            q(f"DELETE FROM {table} WHERE {key} = ?")
            for table, key in (
                ("messages", "conv"),
                ("conversations", "key"),
                ("journals", "conv"),
                ("goals", "conv"),
            )
        ]
        self.journal = q("SELECT body FROM journals WHERE conv = ?")
        self.save_journal = up("journals", "conv, body, updated_at", "conv")
        self.provider_pref = q(
            "SELECT provider FROM provider_prefs WHERE channel = ? AND channel_id = ?"
        )
        self.set_provider_pref = up(
            "provider_prefs", "channel, channel_id, provider, updated_at", "channel, channel_id"
        )
        self.instruction_pref = q(
            "SELECT name FROM instruction_prefs WHERE channel = ? AND channel_id = ?"
        )
        self.drop_instruction_pref = q(
            "DELETE FROM instruction_prefs WHERE channel = ? AND channel_id = ?"
        )
        self.set_instruction_pref = up(
            "instruction_prefs", "channel, channel_id, name, updated_at", "channel, channel_id"
        )
        self.goal = q(f"SELECT {GOAL_COLUMNS} FROM goals WHERE conv = ?")
        self.drop_goal = q("DELETE FROM goals WHERE conv = ?")
        self.save_goal = up(
            "goals", "conv, text, state, auto, max_turns, turns, note, updated_at", "conv"
        )
        self.seen = q("SELECT 1 FROM seen_events WHERE channel = ? AND event_id = ?")
        self.mark_seen = q(
            "INSERT INTO seen_events (channel, event_id, at) VALUES (?, ?, ?) "
            "ON CONFLICT (channel, event_id) DO NOTHING"
        )
        self.request_approval = up(
            "approvals",
            "id, conv, run_id, call_id, tool, summary, reason, state, requested_at, deadline",
            "id",
            reset="prompt, answer, answered_by, resolved_at",
        )
        self.approval_posted = q("UPDATE approvals SET prompt = ? WHERE id = ?")
        self.answer_approval = q(
            "UPDATE approvals SET answer = ?, answered_by = ? "
            "WHERE id = ? AND state = 'pending' AND answer IS NULL"
        )
        self.approval_resolved = q("UPDATE approvals SET state = ?, resolved_at = ? WHERE id = ?")
        self.approval = q(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?")
        self.pending_approval = q(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = ? AND call_id = ? "
            "AND state = 'pending' ORDER BY requested_at DESC LIMIT 1"
        )
        self.pending_approvals = q(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE state = 'pending' "
            "AND requested_at < ? ORDER BY requested_at"
        )
        self.expire_approval = q(
            "UPDATE approvals SET state = 'expired', resolved_at = ? "
            "WHERE id = ? AND state = 'pending'"
        )
        self.add_event = q(
            "INSERT INTO events (at, run_id, conv, iteration, name, data) VALUES (?, ?, ?, ?, ?, ?)"
        )
        self.events = q("SELECT at, name, iteration, data FROM events WHERE run_id = ? ORDER BY id")


SQLITE_CONVERSATIONS = ConversationSql(SQLITE)
POSTGRES_CONVERSATIONS = ConversationSql(POSTGRES)


class ConversationTables(RunTables):
    """Conversations, preferences, goals, seen events, approvals and events over a
    database whose statements `_conv_sql` spells."""

    _conv_sql: ConversationSql

    # --- conversations, messages, snapshots -----------------------------------------

    async def load_messages(self, conv: str) -> list[Message]:
        rows = await self._all(self._conv_sql.load_messages, (conv,))
        return [Message.from_json(row[0]) for row in rows]

    def save_messages(
        self,
        conv: str,
        messages: Sequence[Message],
        changed: Iterable[int] | None = None,
        *,
        shrunk: bool = True,
        run_id: str | None = None,
    ) -> None:
        """Persist the rows `changed` (default: all) of `messages`; if the list may have
        `shrunk`, drop rows past its end. Queued; a later `write()` or `flush()` makes it
        durable. With `run_id`, only while that run is this store's worker's."""
        sql = self._conv_sql
        owner = self._run_owner(run_id)
        fenced = owner[0] is not None  # else the fence holds anyway: leave it out
        if shrunk:
            if fenced:
                self.write_soon(sql.run_drop, (conv, len(messages), *owner))
            else:
                self.write_soon(sql.drop, (conv, len(messages)))
        for seq in range(len(messages)) if changed is None else changed:
            body = messages[seq].to_json()
            if fenced:
                self.write_soon(sql.run_message, (conv, seq, body, *owner))
            else:
                self.write_soon(sql.message, (conv, seq, body))

    async def conversation(self, conv: str) -> ConversationRow | None:
        row = await self._one(self._conv_sql.conversation, (conv,))
        return ConversationRow(*row) if row else None

    def save_snapshot(
        self, conv: str, *, input_tokens: int, output_tokens: int, last_compaction: str | None
    ) -> None:
        """The session snapshot's totals (the messages are saved as they grow)."""
        self.write_soon(
            self._conv_sql.snapshot,
            (conv, input_tokens, output_tokens, last_compaction, time.time()),
        )

    async def clear_conversation(self, conv: str) -> None:
        """`/clear`: history, totals, journal and goal go; provider preference and runs stay."""
        for statement in self._conv_sql.clear:
            self.write_soon(statement, (conv,))
        self.forget_resumable(conv)
        await self.flush()

    # --- journal, provider preferences, goals ---------------------------------------

    async def journal(self, conv: str) -> dict[str, Any] | None:
        row = await self._one(self._conv_sql.journal, (conv,))
        return dict(json.loads(row[0])) if row else None

    def save_journal(self, conv: str, body: dict[str, Any]) -> None:
        self.write_soon(self._conv_sql.save_journal, (conv, json.dumps(body), time.time()))

    async def provider_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(self._conv_sql.provider_pref, (channel, channel_id))
        return str(row[0]) if row else None

    async def set_provider_pref(self, channel: str, channel_id: str, provider: str) -> None:
        await self.write(
            self._conv_sql.set_provider_pref, (channel, channel_id, provider, time.time())
        )

    async def instruction_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(self._conv_sql.instruction_pref, (channel, channel_id))
        return str(row[0]) if row else None

    async def set_instruction_pref(self, channel: str, channel_id: str, name: str | None) -> None:
        if name is None:
            await self.write(self._conv_sql.drop_instruction_pref, (channel, channel_id))
            return
        await self.write(
            self._conv_sql.set_instruction_pref, (channel, channel_id, name, time.time())
        )

    async def goal(self, conv: str) -> GoalRow | None:
        row = await self._one(self._conv_sql.goal, (conv,))
        return goal_row(row) if row else None

    async def save_goal(self, goal: GoalRow | None, conv: str) -> None:
        if goal is None:
            await self.write(self._conv_sql.drop_goal, (conv,))
            return
        await self.write(
            self._conv_sql.save_goal,
            (conv, goal.text, goal.state, goal.auto, goal.max_turns, goal.turns, goal.note,
             time.time()),
        )  # fmt: skip

    # --- platform event dedupe, approvals -------------------------------------------

    async def seen(self, channel: str, event_id: str) -> bool:
        """Whether a platform event id was taken in before (a redelivery)."""
        return await self._one(self._conv_sql.seen, (channel, event_id)) is not None

    def mark_seen_soon(self, channel: str, event_id: str) -> None:
        """Queue the "seen" record (commit it together with what the event produced)."""
        self.write_soon(self._conv_sql.mark_seen, (channel, event_id, time.time()))

    async def mark_seen(self, channel: str, event_id: str) -> None:
        self.mark_seen_soon(channel, event_id)
        await self.flush()

    async def request_approval(self, row: ApprovalRow) -> None:
        """A new pending request, committed (before its prompt is posted)."""
        asked = (row.id, row.conv, row.run_id, row.call_id, row.tool, row.summary, row.reason)
        await self.write(
            self._conv_sql.request_approval, (*asked, "pending", row.requested_at, row.deadline)
        )

    def approval_posted(self, approval_id: str, prompt: PromptRef) -> None:
        """Where the request's prompt is (queued: the next commit carries it)."""
        body = json.dumps([prompt.channel_id, prompt.message_id, prompt.text])
        self.write_soon(self._conv_sql.approval_posted, (body, approval_id))

    async def answer_approval(self, approval_id: str, answer: str, by: str) -> None:
        """An approver's answer to a pending request no run is waiting on yet; the first
        answer stands."""
        await self.write(self._conv_sql.answer_approval, (answer, by, approval_id))

    def approval_resolved(self, approval_id: str, state: str) -> None:
        self.write_soon(self._conv_sql.approval_resolved, (state, time.time(), approval_id))

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        row = await self._one(self._conv_sql.approval, (approval_id,))
        return approval_row(row) if row else None

    async def pending_approval(self, run_id: str, call_id: str) -> ApprovalRow | None:
        """The request tool call `call_id` of run `run_id` is waiting on, if any."""
        row = await self._one(self._conv_sql.pending_approval, (run_id, call_id))
        return approval_row(row) if row else None

    async def pending_approvals(self, *, before: float) -> list[ApprovalRow]:
        """Requests asked before `before` (by an earlier process) and still pending."""
        rows = await self._all(self._conv_sql.pending_approvals, (before,))
        return [approval_row(r) for r in rows]

    def expire_approvals(self, approval_ids: Iterable[str]) -> None:
        """Requests whose runs will not go on: nothing waits for them any more."""
        now = time.time()
        for approval_id in approval_ids:
            self.write_soon(self._conv_sql.expire_approval, (now, approval_id))

    # --- events -----------------------------------------------------------------------

    def add_event(
        self,
        name: str,
        data: dict[str, Any],
        *,
        run_id: str | None,
        conv: str | None,
        iteration: int | None,
        at: float,
    ) -> None:
        self.write_soon(
            self._conv_sql.add_event,
            (at, run_id, conv, iteration, name, json.dumps(data, default=str)),
        )

    async def events(self, run_id: str) -> list[StoredEvent]:
        rows = await self._all(self._conv_sql.events, (run_id,))
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
