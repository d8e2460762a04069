"""Parley's durable state on SQLite (WAL). This module owns the whole schema.

Reads go through aiosqlite. Writes are group-committed: every caller's statements queue
up and one writer runs all that are waiting as a single transaction, in a single hop to a
worker thread (a second connection; WAL lets it write while the reader reads), so 200 busy
conversations cost a handful of commits and thread hops, not thousands. `write()` returns
once its statement is committed (durable); `write_soon()` queues without waiting (events,
snapshots); `flush()` waits for everything queued so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from core.chat import PromptRef
from core.errors import StoreError
from core.messages import Message

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE conversations (
        key TEXT PRIMARY KEY,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        last_compaction TEXT,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (conv, seq)
    ) WITHOUT ROWID;
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, state TEXT NOT NULL, trigger TEXT NOT NULL,
        created_at REAL NOT NULL, started_at REAL, ended_at REAL,
        reason TEXT, text TEXT, iterations INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
        resumable INTEGER NOT NULL DEFAULT 0, error TEXT
    );
    CREATE INDEX runs_conv ON runs (conv, created_at);
    CREATE INDEX runs_state ON runs (state);
    CREATE TABLE checkpoints (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        iteration INTEGER NOT NULL, cursor INTEGER NOT NULL, persisted INTEGER NOT NULL,
        prompt_hash TEXT NOT NULL, completed TEXT NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE tool_calls (
        run_id TEXT NOT NULL, call_id TEXT NOT NULL, name TEXT NOT NULL,
        arguments TEXT NOT NULL, idempotent INTEGER NOT NULL,
        started_at REAL NOT NULL, completed_at REAL, result TEXT, is_error INTEGER,
        PRIMARY KEY (run_id, call_id)
    ) WITHOUT ROWID;
    CREATE TABLE journals (conv TEXT PRIMARY KEY, body TEXT NOT NULL, updated_at REAL NOT NULL);
    CREATE TABLE provider_prefs (
        channel TEXT NOT NULL, channel_id TEXT NOT NULL, provider TEXT NOT NULL,
        updated_at REAL NOT NULL, PRIMARY KEY (channel, channel_id)
    ) WITHOUT ROWID;
    CREATE TABLE goals (
        conv TEXT PRIMARY KEY, text TEXT NOT NULL, state TEXT NOT NULL,
        auto INTEGER NOT NULL DEFAULT 0, max_turns INTEGER NOT NULL DEFAULT 0,
        turns INTEGER NOT NULL DEFAULT 0, note TEXT, updated_at REAL NOT NULL
    );
    CREATE TABLE seen_events (
        channel TEXT NOT NULL, event_id TEXT NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (channel, event_id)
    ) WITHOUT ROWID;
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, run_id TEXT, tool TEXT NOT NULL,
        summary TEXT NOT NULL, state TEXT NOT NULL, requested_at REAL NOT NULL,
        resolved_at REAL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, run_id TEXT, conv TEXT,
        iteration INTEGER, name TEXT NOT NULL, data TEXT NOT NULL
    );
    CREATE INDEX events_run ON events (run_id);
    CREATE TABLE job_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, fire_time REAL NOT NULL,
        run_id TEXT, started_at REAL NOT NULL, ended_at REAL, state TEXT NOT NULL,
        result TEXT, delivered INTEGER NOT NULL DEFAULT 0, error TEXT,
        UNIQUE (job, fire_time)
    );
    """,
    2: """
    CREATE TABLE tool_groups (
        pgid INTEGER NOT NULL, start_ticks INTEGER NOT NULL, boot_id TEXT NOT NULL,
        PRIMARY KEY (boot_id, pgid)
    ) WITHOUT ROWID;
    """,
    3: """
    ALTER TABLE approvals ADD COLUMN call_id TEXT;
    ALTER TABLE approvals ADD COLUMN reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE approvals ADD COLUMN deadline REAL;
    ALTER TABLE approvals ADD COLUMN prompt TEXT;
    ALTER TABLE approvals ADD COLUMN answer TEXT;
    ALTER TABLE approvals ADD COLUMN answered_by TEXT;
    CREATE INDEX approvals_state ON approvals (state);
    """,
}


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    conv: str
    state: str
    trigger: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    reason: str | None
    text: str | None
    iterations: int
    input_tokens: int
    output_tokens: int
    resumable: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    run_id: str
    seq: int
    kind: str
    iteration: int
    cursor: int
    persisted: int
    prompt_hash: str
    completed: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class ToolCallRow:
    call_id: str
    name: str
    arguments: str
    idempotent: bool
    started_at: float
    completed_at: float | None
    result: str | None
    is_error: bool

    @property
    def completed(self) -> bool:
        return self.completed_at is not None


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One approval request. `pending` until the run that asked takes the decision; an
    approver's `answer` can arrive before that (a click just after a restart)."""

    id: str
    conv: str
    run_id: str | None
    call_id: str | None
    tool: str
    summary: str
    reason: str
    state: str  # pending | approved | denied | cancelled | expired
    requested_at: float
    deadline: float | None
    prompt: PromptRef | None
    answer: str | None  # approved | denied, while still pending
    answered_by: str | None


@dataclass(frozen=True, slots=True)
class ConversationRow:
    key: str
    input_tokens: int
    output_tokens: int
    last_compaction: str | None


@dataclass(frozen=True, slots=True)
class GoalRow:
    conv: str
    text: str
    state: str
    auto: bool
    max_turns: int
    turns: int
    note: str | None


_APPROVAL_COLUMNS = (
    "id, conv, run_id, call_id, tool, summary, reason, state, requested_at, deadline, prompt, "
    "answer, answered_by"
)

_RUN_COLUMNS = (
    "id, conv, state, trigger, created_at, started_at, ended_at, reason, text, iterations, "
    "input_tokens, output_tokens, resumable, error"
)

_Statement = tuple[str, Sequence[Any]]
_WRITER: contextvars.ContextVar[str | None] = contextvars.ContextVar("store_writer", default=None)


class Store:
    failed_writes = 0
    """Statements that failed, in every store of this process (the tests watch it)."""

    """One SQLite database; open with `await Store.open(path)`, close with `aclose()`."""

    def __init__(self, conn: aiosqlite.Connection, writer: sqlite3.Connection) -> None:
        self._conn = conn
        self._write_conn = writer
        self._inflight: asyncio.Future[None] | None = None
        self._pending: list[tuple[int, _Statement, asyncio.Future[None] | None, str | None]] = []
        self._seq = 0  # statements queued so far
        # Failed write_soon statements: (seq, error, owner), until a flush reports them.
        self._failures: list[tuple[int, StoreError, str | None]] = []
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name="parley-store-writer")
        self.commits = 0

    @classmethod
    async def open(cls, path: Path | str) -> Store:
        """Open (creating and migrating) the database file at `path`."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(str(path), isolation_level=None)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA busy_timeout=5000")
        await _migrate(conn)
        writer = await asyncio.to_thread(_writer_connection, str(path))
        return cls(conn, writer)

    async def aclose(self) -> None:
        """Flush what is queued, then close both connections — also when the flush
        fails: aiosqlite's worker thread would otherwise keep the process alive."""
        try:
            while self._pending or self._inflight is not None:  # also what flushing queued
                await self.flush()
        finally:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            await self._conn.close()
            self._write_conn.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the writer -----------------------------------------------------------------

    async def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement and return when it is committed.

        Raises:
            StoreError: this statement failed (the rest of its batch was committed).
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue((sql, params), done)
        await done

    def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Queue one statement for the next group commit without waiting for it; a failure
        is raised by the next `flush`."""
        self._queue((sql, params), None)

    def _queue(self, statement: _Statement, done: asyncio.Future[None] | None) -> None:
        self._seq += 1
        self._pending.append((self._seq, statement, done, _WRITER.get()))
        self._wake.set()

    @staticmethod
    def write_for(owner: str) -> None:
        """Tag the current task's writes as `owner`'s (a conversation), so that a failed
        one is raised by that owner's `flush`, not by another conversation's."""
        _WRITER.set(owner)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (also a batch in flight).

        Raises:
            StoreError: a statement this task's owner (see `write_for`) queued before this
                call failed, and no `flush` has reported it yet.
        """
        upto, owner = self._seq, _WRITER.get()
        if self._pending:
            with contextlib.suppress(StoreError):  # the sentinel itself cannot fail
                await self.write("SELECT 1")  # the writer is sequential: this commits last
        elif self._inflight is not None:
            await asyncio.shield(self._inflight)
        failed = [f for f in self._failures if f[0] <= upto and f[2] == owner]
        if failed:
            self._failures = [f for f in self._failures if f not in failed]
            raise StoreError(f"{len(failed)} store write(s) failed; the first: {failed[0][1]}")

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            self._inflight = asyncio.get_running_loop().create_future()
            try:
                errors = await self._commit([entry[1] for entry in batch])
            except Exception as exc:  # not a statement's fault (e.g. the disk): all hear it
                errors = dict.fromkeys(range(len(batch)), exc)
            finally:
                self._inflight.set_result(None)
                self._inflight = None
            for index, (seq, (sql, _), done, owner) in enumerate(batch):
                error = errors.get(index)
                if error is None:
                    if done is not None and not done.done():
                        done.set_result(None)
                    continue
                problem = StoreError(f"{error} (in: {sql.split('(')[0].strip()[:80]})")
                log.error("store: a write failed: %s", problem)
                Store.failed_writes += 1
                if done is not None:
                    if not done.done():
                        done.set_exception(problem)
                else:
                    self._failures.append((seq, problem, owner))

    async def _commit(self, statements: list[_Statement]) -> dict[int, Exception]:
        """Commit `statements`; returns the failed ones by index (the others are written).
        One thread hop per batch; the writer loop never runs two at once."""
        errors = await asyncio.to_thread(_commit_batch, self._write_conn, statements)
        self.commits += 1
        return errors

    async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        async with self._conn.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> aiosqlite.Row | None:
        async with self._conn.execute(sql, params) as cursor:
            return await cursor.fetchone()

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
    ) -> None:
        """Persist the rows `changed` (default: all) of `messages`; if the list may have
        `shrunk`, drop rows past its end. Queued; a later `write()` or `flush()` makes it
        durable."""
        if shrunk:
            drop = "DELETE FROM messages WHERE conv = ? AND seq >= ?"
            self.write_soon(drop, (conv, len(messages)))
        for seq in range(len(messages)) if changed is None else changed:
            self.write_soon(
                "INSERT OR REPLACE INTO messages (conv, seq, body) VALUES (?, ?, ?)",
                (conv, seq, messages[seq].model_dump_json()),
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
        """`/clear`: history, totals and journal go; provider preference and runs stay."""
        self.write_soon("DELETE FROM messages WHERE conv = ?", (conv,))
        self.write_soon("DELETE FROM conversations WHERE key = ?", (conv,))
        self.write_soon("DELETE FROM journals WHERE conv = ?", (conv,))
        self.write_soon("DELETE FROM goals WHERE conv = ?", (conv,))
        self.forget_resumable(conv)
        await self.flush()

    # --- runs and checkpoints -------------------------------------------------------

    async def create_run(
        self, run_id: str, conv: str, trigger: str, *, state: str = "running", text: str = ""
    ) -> None:
        """A new run, committed (`queued` ones keep the user's message in `text` until
        they start)."""
        now = time.time()
        await self.write(
            "INSERT INTO runs (id, conv, state, trigger, created_at, started_at, text) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, conv, state, trigger, now, None if state == "queued" else now, text),
        )

    def start_run(self, run_id: str) -> None:
        """A queued run begins."""
        self.write_soon(
            "UPDATE runs SET state = 'running', started_at = ? WHERE id = ?", (time.time(), run_id)
        )

    def resume_run(self, run_id: str) -> None:
        """An interrupted run goes on (`/resume`)."""
        self.write_soon(
            "UPDATE runs SET state = 'running', resumable = 0, ended_at = NULL WHERE id = ?",
            (run_id,),
        )

    def set_run_state(
        self, run_id: str, state: str, reason: str, *, resumable: bool | None = None
    ) -> None:
        """A run ends (or waits) without an answer of its own: cancelled, failed,
        waiting on a human, interrupted."""
        if resumable is None:
            self.write_soon(
                "UPDATE runs SET state = ?, reason = ?, ended_at = ? WHERE id = ?",
                (state, reason, time.time(), run_id),
            )
        else:
            self.write_soon(
                "UPDATE runs SET state = ?, reason = ?, ended_at = ?, resumable = ? WHERE id = ?",
                (state, reason, time.time(), int(resumable), run_id),
            )

    def mark_resumable(self, run_id: str) -> None:
        self.write_soon("UPDATE runs SET resumable = 1 WHERE id = ?", (run_id,))

    def finish_run(
        self,
        run_id: str,
        *,
        state: str,
        reason: str,
        text: str,
        iterations: int,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        """A run's final row: how it ended, its answer and what it used."""
        self.write_soon(
            "UPDATE runs SET state = ?, ended_at = ?, reason = ?, text = ?, iterations = ?, "
            "input_tokens = ?, output_tokens = ? WHERE id = ?",
            (state, time.time(), reason, text, iterations, input_tokens, output_tokens, run_id),
        )

    def forget_resumable(self, conv: str) -> None:
        """New input in a conversation supersedes its interrupted runs."""
        self.write_soon("UPDATE runs SET resumable = 0 WHERE conv = ? AND resumable = 1", (conv,))

    async def run(self, run_id: str) -> RunRow | None:
        row = await self._one(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return _run_row(row) if row else None

    async def find_runs(self, prefix: str) -> list[RunRow]:
        rows = await self._all(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE id LIKE ? ORDER BY created_at DESC",
            (prefix + "%",),
        )
        return [_run_row(r) for r in rows]

    async def runs(
        self, *, conv: str | None = None, states: Iterable[str] = (), limit: int = 20
    ) -> list[RunRow]:
        where, params = [], []
        if conv is not None:
            where.append("conv = ?")
            params.append(conv)
        states = list(states)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._all(
            f"SELECT {_RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC LIMIT ?",
            (*params, limit),
        )
        return [_run_row(r) for r in rows]

    def checkpoint(self, cp: Checkpoint) -> None:
        self.write_soon(
            "INSERT OR REPLACE INTO checkpoints (run_id, seq, kind, iteration, cursor, "
            "persisted, prompt_hash, completed, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                cp.run_id,
                cp.seq,
                cp.kind,
                cp.iteration,
                cp.cursor,
                cp.persisted,
                cp.prompt_hash,
                json.dumps(list(cp.completed)),
                cp.at,
            ),
        )

    async def last_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._one(
            "SELECT run_id, seq, kind, iteration, cursor, persisted, prompt_hash, completed, at "
            "FROM checkpoints WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
            (run_id,),
        )
        if row is None:
            return None
        run, seq, kind, iteration, cursor, persisted, prompt_hash, completed, at = row
        done = tuple(json.loads(completed))
        return Checkpoint(run, seq, kind, iteration, cursor, persisted, prompt_hash, done, at)

    # --- the idempotency envelope ---------------------------------------------------

    def tool_started(
        self, run_id: str, call_id: str, name: str, arguments: str, idempotent: bool
    ) -> None:
        """Queued; flush before running a side-effecting call, so a crash after it shows."""
        self.write_soon(
            "INSERT OR REPLACE INTO tool_calls (run_id, call_id, name, arguments, idempotent, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, call_id, name, arguments, int(idempotent), time.time()),
        )

    def tool_completed(self, run_id: str, call_id: str, result: str, is_error: bool) -> None:
        self.write_soon(
            "UPDATE tool_calls SET completed_at = ?, result = ?, is_error = ? "
            "WHERE run_id = ? AND call_id = ?",
            (time.time(), result, int(is_error), run_id, call_id),
        )

    async def tool_calls(self, run_id: str) -> dict[str, ToolCallRow]:
        rows = await self._all(
            "SELECT call_id, name, arguments, idempotent, started_at, completed_at, result, "
            "is_error FROM tool_calls WHERE run_id = ?",
            (run_id,),
        )
        return {
            r[0]: ToolCallRow(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6], bool(r[7]))
            for r in rows
        }

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

    async def goal(self, conv: str) -> GoalRow | None:
        row = await self._one(
            "SELECT conv, text, state, auto, max_turns, turns, note FROM goals WHERE conv = ?",
            (conv,),
        )
        if row is None:
            return None
        return GoalRow(row[0], row[1], row[2], bool(row[3]), row[4], row[5], row[6])

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

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None:
        """A tool's process group is live (the reaper's ledger; see core/tools/reaper.py)."""
        self.write_soon(
            "INSERT OR REPLACE INTO tool_groups (pgid, start_ticks, boot_id) VALUES (?, ?, ?)",
            (pgid, start_ticks, boot_id),
        )

    def tool_group_ended(self, pgid: int) -> None:
        self.write_soon("DELETE FROM tool_groups WHERE pgid = ?", (pgid,))

    async def take_tool_groups(self) -> list[tuple[int, int, str]]:
        """The groups a crashed process left listed, removed from the ledger."""
        rows = await self._all("SELECT pgid, start_ticks, boot_id FROM tool_groups")
        await self.write("DELETE FROM tool_groups")
        return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

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
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE id = ?", (approval_id,)
        )
        return _approval_row(row) if row else None

    async def pending_approval(self, run_id: str, call_id: str) -> ApprovalRow | None:
        """The request tool call `call_id` of run `run_id` is waiting on, if any."""
        row = await self._one(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE run_id = ? AND call_id = ? "
            "AND state = 'pending' ORDER BY requested_at DESC LIMIT 1",
            (run_id, call_id),
        )
        return _approval_row(row) if row else None

    async def pending_approvals(self, *, before: float) -> list[ApprovalRow]:
        """Requests asked before `before` (by an earlier process) and still pending."""
        rows = await self._all(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE state = 'pending' "
            "AND requested_at < ? ORDER BY requested_at",
            (before,),
        )
        return [_approval_row(r) for r in rows]

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

    async def events(self, run_id: str) -> list[tuple[float, str, int | None, dict[str, Any]]]:
        rows = await self._all(
            "SELECT at, name, iteration, data FROM events WHERE run_id = ? ORDER BY id", (run_id,)
        )
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    # --- scheduled jobs -----------------------------------------------------------------

    async def job_last_fire(self, job: str) -> float | None:
        """The latest fire claimed for `job` (runs are never deleted)."""
        row = await self._one("SELECT MAX(fire_time) FROM job_runs WHERE job = ?", (job,))
        return float(row[0]) if row and row[0] is not None else None

    async def claim_job_fire(self, job: str, fire_time: float) -> int | None:
        """Record a fire before it runs; None if this fire was already claimed (a restart
        must never run the same fire twice). Atomic across tasks and processes: the unique
        (job, fire_time) row is won by whoever's claim token it carries."""
        row = await self._one(
            "SELECT 1 FROM job_runs WHERE job = ? AND fire_time = ?", (job, fire_time)
        )
        if row is not None:
            return None
        token = f"claim:{uuid.uuid4().hex}"  # replaced by the agent's run id when it ends
        await self.write(
            "INSERT OR IGNORE INTO job_runs (job, fire_time, run_id, started_at, state) "
            "VALUES (?, ?, ?, ?, 'running')",
            (job, fire_time, token, time.time()),
        )
        found = await self._one(
            "SELECT id, run_id FROM job_runs WHERE job = ? AND fire_time = ?", (job, fire_time)
        )
        if found is None or found[1] != token:
            return None
        return int(found[0])

    async def finish_job_run(
        self,
        job_run_id: int,
        *,
        state: str,
        run_id: str | None,
        result: str | None,
        delivered: bool,
        error: str | None,
    ) -> None:
        await self.write(
            "UPDATE job_runs SET ended_at = ?, state = ?, run_id = ?, result = ?, delivered = ?, "
            "error = ? WHERE id = ?",
            (time.time(), state, run_id, result, int(delivered), error, job_run_id),
        )

    async def job_runs(self, job: str, limit: int = 1) -> list[dict[str, Any]]:
        rows = await self._all(
            "SELECT id, fire_time, run_id, started_at, ended_at, state, result, delivered, error "
            "FROM job_runs WHERE job = ? ORDER BY fire_time DESC LIMIT ?",
            (job, limit),
        )
        keys = (
            "id",
            "fire_time",
            "run_id",
            "started_at",
            "ended_at",
            "state",
            "result",
            "delivered",
            "error",
        )
        return [dict(zip(keys, r, strict=True)) for r in rows]


def _approval_row(row: aiosqlite.Row) -> ApprovalRow:
    values = list(row)
    if values[10] is not None:
        values[10] = PromptRef(*json.loads(values[10]))
    return ApprovalRow(*values)


def _run_row(row: aiosqlite.Row) -> RunRow:
    values = list(row)
    values[12] = bool(values[12])
    return RunRow(*values)


def _writer_connection(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _commit_batch(conn: sqlite3.Connection, statements: list[_Statement]) -> dict[int, Exception]:
    """Run `statements` as one transaction (in the writer's thread). If one fails, the
    batch is run again statement by statement, each under a savepoint, so the bad one
    alone is left out. Returns the failed statements' errors by index."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, group in _grouped(statements):
            if len(group) == 1:
                conn.execute(sql, group[0])
            else:
                conn.executemany(sql, group)
        conn.execute("COMMIT")
        return {}
    except sqlite3.Error:
        conn.execute("ROLLBACK")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    errors: dict[int, Exception] = {}
    conn.execute("BEGIN IMMEDIATE")
    try:
        for index, (sql, params) in enumerate(statements):
            conn.execute("SAVEPOINT one")
            try:
                conn.execute(sql, params)
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK TO one")
                errors[index] = exc
            conn.execute("RELEASE one")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return errors


def _grouped(statements: list[_Statement]) -> list[tuple[str, list[Sequence[Any]]]]:
    """Consecutive runs of the same SQL become one `executemany`."""
    groups: list[tuple[str, list[Sequence[Any]]]] = []
    for sql, params in statements:
        if groups and groups[-1][0] == sql:
            groups[-1][1].append(params)
        else:
            groups.append((sql, [params]))
    return groups


async def _migrate(conn: aiosqlite.Connection) -> None:
    await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    async with conn.execute("SELECT MAX(version) FROM schema_version") as cursor:
        row = await cursor.fetchone()
    current = int(row[0]) if row and row[0] is not None else 0
    if current > SCHEMA_VERSION:
        raise RuntimeError(
            f"the database is from a newer Parley (schema {current} > {SCHEMA_VERSION}); "
            "upgrade Parley or point [store] path at another file"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        await conn.executescript(
            "BEGIN;\n"
            + _MIGRATIONS[version]
            + f"\nINSERT INTO schema_version (version) VALUES ({version});\nCOMMIT;"
        )
