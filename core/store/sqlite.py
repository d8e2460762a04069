"""Parley's durable state on SQLite (WAL): `SqliteStore`, the embedded `Store`.

The methods are split by concern like the protocol: `sqlite_db.py` holds the connections
and the group commit, `sqlite_runs.py` runs and jobs, `sqlite_workers.py` what workers
coordinate through, `sqlite_memory.py` long-term memory, this module the rest and
`open`; `migrations.py` owns the schema.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from core.chat import PromptRef
from core.messages import Message
from core.store.migrations import migrate
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
from core.store.sqlite_db import BUSY_TIMEOUT_MS, reader_connection, writer_connection
from core.store.sqlite_grants import SqliteGrantTables
from core.store.sqlite_memory import SqliteMemoryTables
from core.store.sqlite_runs import OWNS_RUN
from core.store.sqlite_workers import SqliteWorkerTables


class SqliteStore(SqliteWorkerTables, SqliteMemoryTables, SqliteGrantTables):
    """One SQLite database; open with `await SqliteStore.open(path)` (or
    `core.store.open_store`), close with `aclose()`."""

    @classmethod
    async def open(cls, path: Path | str) -> SqliteStore:
        """Open (creating and migrating) the database file at `path`."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(str(path), isolation_level=None)
        try:
            await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")  # first: others may lock
            await _switch_to_wal(conn)
            await migrate(conn)
            writer = await asyncio.to_thread(writer_connection, str(path))
            reader = await asyncio.to_thread(reader_connection, str(path))
        except BaseException:
            # aiosqlite's thread is not a daemon: left open, it keeps the process from
            # ever exiting (the test suite hung at exit after a failed open)
            await conn.close()
            raise
        store = cls(conn, writer, reader)
        store.where = str(path)
        return store

    where = ""  # the database file

    def describe(self) -> str:
        return self.where

    # --- conversations, messages, snapshots -----------------------------------------

    async def load_messages(self, conv: str) -> list[Message]:
        rows = await self._all("SELECT body FROM messages WHERE conv = ? ORDER BY seq", (conv,))
        return [Message.model_validate_json(row[0]) for row in rows]

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
        owner = self._run_owner(run_id)
        if shrunk:
            drop = f"DELETE FROM messages WHERE conv = ? AND seq >= ? AND {OWNS_RUN}"
            self.write_soon(drop, (conv, len(messages), *owner))
        for seq in range(len(messages)) if changed is None else changed:
            self.write_soon(
                "INSERT OR REPLACE INTO messages (conv, seq, body) "
                f"SELECT ?, ?, ? WHERE {OWNS_RUN}",
                (conv, seq, messages[seq].model_dump_json(), *owner),
            )

    async def conversation(self, conv: str) -> ConversationRow | None:
        row = await self._one(
            "SELECT key, input_tokens, output_tokens, last_compaction "
            "FROM conversations WHERE key = ?",
            (conv,),
        )
        return ConversationRow(*row) if row else None

    def save_snapshot(
        self, conv: str, *, input_tokens: int, output_tokens: int, last_compaction: str | None
    ) -> None:
        """The session snapshot's totals (the messages are saved as they grow)."""
        self.write_soon(
            "INSERT OR REPLACE INTO conversations (key, input_tokens, output_tokens, "
            "last_compaction, updated_at) VALUES (?, ?, ?, ?, ?)",
            (conv, input_tokens, output_tokens, last_compaction, time.time()),
        )

    async def clear_conversation(self, conv: str) -> None:
        """`/clear`: history, totals, journal and goal go; provider preference and runs stay."""
        self.write_soon("DELETE FROM messages WHERE conv = ?", (conv,))
        self.write_soon("DELETE FROM conversations WHERE key = ?", (conv,))
        self.write_soon("DELETE FROM journals WHERE conv = ?", (conv,))
        self.write_soon("DELETE FROM goals WHERE conv = ?", (conv,))
        self.forget_resumable(conv)
        await self.flush()

    # --- journal, provider preferences, goals ---------------------------------------

    async def journal(self, conv: str) -> dict[str, Any] | None:
        row = await self._one("SELECT body FROM journals WHERE conv = ?", (conv,))
        return dict(json.loads(row[0])) if row else None

    def save_journal(self, conv: str, body: dict[str, Any]) -> None:
        self.write_soon(
            "INSERT OR REPLACE INTO journals (conv, body, updated_at) VALUES (?, ?, ?)",
            (conv, json.dumps(body), time.time()),
        )

    async def provider_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(
            "SELECT provider FROM provider_prefs WHERE channel = ? AND channel_id = ?",
            (channel, channel_id),
        )
        return str(row[0]) if row else None

    async def set_provider_pref(self, channel: str, channel_id: str, provider: str) -> None:
        await self.write(
            "INSERT OR REPLACE INTO provider_prefs (channel, channel_id, provider, updated_at) "
            "VALUES (?, ?, ?, ?)",
            (channel, channel_id, provider, time.time()),
        )

    async def instruction_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(
            "SELECT name FROM instruction_prefs WHERE channel = ? AND channel_id = ?",
            (channel, channel_id),
        )
        return str(row[0]) if row else None

    async def set_instruction_pref(self, channel: str, channel_id: str, name: str | None) -> None:
        if name is None:
            await self.write(
                "DELETE FROM instruction_prefs WHERE channel = ? AND channel_id = ?",
                (channel, channel_id),
            )
            return
        await self.write(
            "INSERT OR REPLACE INTO instruction_prefs (channel, channel_id, name, updated_at) "
            "VALUES (?, ?, ?, ?)",
            (channel, channel_id, name, time.time()),
        )

    async def goal(self, conv: str) -> GoalRow | None:
        row = await self._one(f"SELECT {GOAL_COLUMNS} FROM goals WHERE conv = ?", (conv,))
        return goal_row(row) if row else None

    async def save_goal(self, goal: GoalRow | None, conv: str) -> None:
        if goal is None:
            await self.write("DELETE FROM goals WHERE conv = ?", (conv,))
            return
        await self.write(
            "INSERT OR REPLACE INTO goals (conv, text, state, auto, max_turns, turns, note, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conv,
                goal.text,
                goal.state,
                int(goal.auto),
                goal.max_turns,
                goal.turns,
                goal.note,
                time.time(),
            ),
        )

    # --- platform event dedupe, approvals -------------------------------------------

    async def seen(self, channel: str, event_id: str) -> bool:
        """Whether a platform event id was taken in before (a redelivery)."""
        row = await self._one(
            "SELECT 1 FROM seen_events WHERE channel = ? AND event_id = ?", (channel, event_id)
        )
        return row is not None

    def mark_seen_soon(self, channel: str, event_id: str) -> None:
        """Queue the "seen" record (commit it together with what the event produced)."""
        self.write_soon(
            "INSERT OR IGNORE INTO seen_events (channel, event_id, at) VALUES (?, ?, ?)",
            (channel, event_id, time.time()),
        )

    async def mark_seen(self, channel: str, event_id: str) -> None:
        self.mark_seen_soon(channel, event_id)
        await self.flush()

    async def request_approval(self, row: ApprovalRow) -> None:
        """A new pending request, committed (before its prompt is posted)."""
        await self.write(
            "INSERT OR REPLACE INTO approvals (id, conv, run_id, call_id, tool, summary, reason, "
            "state, requested_at, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
            (
                row.id,
                row.conv,
                row.run_id,
                row.call_id,
                row.tool,
                row.summary,
                row.reason,
                row.requested_at,
                row.deadline,
            ),
        )

    def approval_posted(self, approval_id: str, prompt: PromptRef) -> None:
        """Where the request's prompt is (queued: the next commit carries it)."""
        body = json.dumps([prompt.channel_id, prompt.message_id, prompt.text])
        self.write_soon("UPDATE approvals SET prompt = ? WHERE id = ?", (body, approval_id))

    async def answer_approval(self, approval_id: str, answer: str, by: str) -> None:
        """An approver's answer to a pending request no run is waiting on yet; the first
        answer stands."""
        await self.write(
            "UPDATE approvals SET answer = ?, answered_by = ? "
            "WHERE id = ? AND state = 'pending' AND answer IS NULL",
            (answer, by, approval_id),
        )

    def approval_resolved(self, approval_id: str, state: str) -> None:
        self.write_soon(
            "UPDATE approvals SET state = ?, resolved_at = ? WHERE id = ?",
            (state, time.time(), approval_id),
        )

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        row = await self._one(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (approval_id,)
        )
        return approval_row(row) if row else None

    async def pending_approval(self, run_id: str, call_id: str) -> ApprovalRow | None:
        """The request tool call `call_id` of run `run_id` is waiting on, if any."""
        row = await self._one(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = ? AND call_id = ? "
            "AND state = 'pending' ORDER BY requested_at DESC LIMIT 1",
            (run_id, call_id),
        )
        return approval_row(row) if row else None

    async def pending_approvals(self, *, before: float) -> list[ApprovalRow]:
        """Requests asked before `before` (by an earlier process) and still pending."""
        rows = await self._all(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE state = 'pending' "
            "AND requested_at < ? ORDER BY requested_at",
            (before,),
        )
        return [approval_row(r) for r in rows]

    def expire_approvals(self, approval_ids: Iterable[str]) -> None:
        """Requests whose runs will not go on: nothing waits for them any more."""
        now = time.time()
        for approval_id in approval_ids:
            self.write_soon(
                "UPDATE approvals SET state = 'expired', resolved_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (now, approval_id),
            )

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
            "INSERT INTO events (at, run_id, conv, iteration, name, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (at, run_id, conv, iteration, name, json.dumps(data, default=str)),
        )

    async def events(self, run_id: str) -> list[StoredEvent]:
        rows = await self._all(
            "SELECT at, name, iteration, data FROM events WHERE run_id = ? ORDER BY id", (run_id,)
        )
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]


async def _switch_to_wal(conn: aiosqlite.Connection) -> None:
    """`journal_mode=WAL`. On a new file opened by several stores at once, the switch can
    meet another opener's read lock, and SQLite answers "database is locked" at once
    instead of waiting (waiting could deadlock): try again until `busy_timeout`."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.01)
