"""Parley's durable state on PostgreSQL: `PostgresStore`, the `Store` that any number of
`parley run` workers share (docs/scale-out.md). Same protocol, same schema, same semantics as
`SqliteStore`; `tests/store/` runs its whole conformance suite against both.

The driver is psycopg 3 (with psycopg_pool), not asyncpg: it is typed (`py.typed`, so
`mypy --strict` checks our calls), it maps every SQLSTATE to its own exception class
(a deadlock is told from a bad row without parsing text), its pipeline mode sends a whole
group commit — different statements included — in one round trip (asyncpg pipelines only
`executemany` of one statement), and it takes libpq's URLs and options as they are (so
`?options=-csearch_path%3D…` picks a schema). Both are well kept; asyncpg is faster per
statement, which a group commit of one round trip per batch does not need.

The methods are split by concern like the protocol: `postgres_db.py` holds the pool and the
group commit, `postgres_runs.py` runs and jobs, `postgres_workers.py` what workers
coordinate through, `postgres_memory.py` long-term memory, this module the rest and
`open`; `postgres_schema.py` owns the schema.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from core.chat import PromptRef
from core.errors import ConfigError
from core.messages import Message
from core.store.postgres_db import connection_kwargs, open_pool, upsert, where
from core.store.postgres_grants import PostgresGrantTables
from core.store.postgres_memory import PostgresMemoryTables
from core.store.postgres_runs import OWNS_RUN
from core.store.postgres_schema import migrate
from core.store.postgres_workers import PostgresWorkerTables
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

_MESSAGE = upsert("messages", "conv, seq, body", "conv, seq")
_RUN_MESSAGE = upsert("messages", "conv, seq, body", "conv, seq", where=OWNS_RUN)
_RUN_DROP = f"DELETE FROM messages WHERE conv = %s AND seq >= %s AND {OWNS_RUN}"
_SNAPSHOT = upsert(
    "conversations", "key, input_tokens, output_tokens, last_compaction, updated_at", "key"
)
_JOURNAL = upsert("journals", "conv, body, updated_at", "conv")
_PROVIDER = upsert(
    "provider_prefs", "channel, channel_id, provider, updated_at", "channel, channel_id"
)
_INSTRUCTIONS = upsert(
    "instruction_prefs", "channel, channel_id, name, updated_at", "channel, channel_id"
)
_GOAL = upsert("goals", "conv, text, state, auto, max_turns, turns, note, updated_at", "conv")
_APPROVAL = upsert(
    "approvals",
    "id, conv, run_id, call_id, tool, summary, reason, state, requested_at, deadline",
    "id",
    reset="prompt, answer, answered_by, resolved_at",
)


class PostgresStore(PostgresWorkerTables, PostgresMemoryTables, PostgresGrantTables):
    """One PostgreSQL database (or schema); open with `await PostgresStore.open(url)` (or
    `core.store.open_store`), close with `aclose()`."""

    @classmethod
    async def open(cls, url: str, *, password: str | None = None) -> PostgresStore:
        """Connect to `url` (libpq's URL form; `password` if the server wants one), migrate
        its schema (one worker at a time) and open the pool.

        Raises:
            ConfigError: `url` is malformed, holds a password, or names a server that
                cannot be reached or refuses us.
        """
        kwargs = connection_kwargs(url, password)
        try:
            async with await psycopg.AsyncConnection.connect(url, **kwargs) as conn:
                await migrate(conn)
                info = conn.info
                cursor = await conn.execute("SELECT current_schema()")
                schema = await cursor.fetchone()
                opened = f"PostgreSQL {info.host}:{info.port} database {info.dbname}"
            pool = await open_pool(url, kwargs)
        except psycopg.Error as exc:
            raise ConfigError(
                "store.url",
                f"cannot open the PostgreSQL store at {where(url)}: {str(exc).strip()}",
                "check that the server is up and the URL, user and `store.password_env` are right",
            ) from exc
        store = cls(pool)
        store.url, store.connect_kwargs = url, kwargs  # for the listener (`notify.py`)
        # what was opened, as the server has it (never the password)
        store.opened = opened
        if schema and schema[0] not in (None, "public"):
            store.opened += f" schema {schema[0]}"
        return store

    opened = ""

    def describe(self) -> str:
        return self.opened

    # --- conversations, messages, snapshots -----------------------------------------

    async def load_messages(self, conv: str) -> list[Message]:
        rows = await self._all("SELECT body FROM messages WHERE conv = %s ORDER BY seq", (conv,))
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
        owner = self._run_owner(run_id)
        fenced = owner[0] is not None
        if shrunk:
            if fenced:
                self.write_soon(_RUN_DROP, (conv, len(messages), *owner))
            else:
                drop = "DELETE FROM messages WHERE conv = %s AND seq >= %s"
                self.write_soon(drop, (conv, len(messages)))
        for seq in range(len(messages)) if changed is None else changed:
            body = messages[seq].model_dump_json()
            if fenced:
                self.write_soon(_RUN_MESSAGE, (conv, seq, body, *owner))
            else:
                self.write_soon(_MESSAGE, (conv, seq, body))

    async def conversation(self, conv: str) -> ConversationRow | None:
        row = await self._one(
            "SELECT key, input_tokens, output_tokens, last_compaction "
            "FROM conversations WHERE key = %s",
            (conv,),
        )
        return ConversationRow(*row) if row else None

    def save_snapshot(
        self, conv: str, *, input_tokens: int, output_tokens: int, last_compaction: str | None
    ) -> None:
        self.write_soon(
            _SNAPSHOT, (conv, input_tokens, output_tokens, last_compaction, time.time())
        )

    async def clear_conversation(self, conv: str) -> None:
        self.write_soon("DELETE FROM messages WHERE conv = %s", (conv,))
        self.write_soon("DELETE FROM conversations WHERE key = %s", (conv,))
        self.write_soon("DELETE FROM journals WHERE conv = %s", (conv,))
        self.write_soon("DELETE FROM goals WHERE conv = %s", (conv,))
        self.forget_resumable(conv)
        await self.flush()

    # --- journal, provider preferences, goals ---------------------------------------

    async def journal(self, conv: str) -> dict[str, Any] | None:
        row = await self._one("SELECT body FROM journals WHERE conv = %s", (conv,))
        return dict(json.loads(row[0])) if row else None

    def save_journal(self, conv: str, body: dict[str, Any]) -> None:
        self.write_soon(_JOURNAL, (conv, json.dumps(body), time.time()))

    async def provider_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(
            "SELECT provider FROM provider_prefs WHERE channel = %s AND channel_id = %s",
            (channel, channel_id),
        )
        return str(row[0]) if row else None

    async def set_provider_pref(self, channel: str, channel_id: str, provider: str) -> None:
        await self.write(_PROVIDER, (channel, channel_id, provider, time.time()))

    async def instruction_pref(self, channel: str, channel_id: str) -> str | None:
        row = await self._one(
            "SELECT name FROM instruction_prefs WHERE channel = %s AND channel_id = %s",
            (channel, channel_id),
        )
        return str(row[0]) if row else None

    async def set_instruction_pref(self, channel: str, channel_id: str, name: str | None) -> None:
        if name is None:
            await self.write(
                "DELETE FROM instruction_prefs WHERE channel = %s AND channel_id = %s",
                (channel, channel_id),
            )
            return
        await self.write(_INSTRUCTIONS, (channel, channel_id, name, time.time()))

    async def goal(self, conv: str) -> GoalRow | None:
        row = await self._one(f"SELECT {GOAL_COLUMNS} FROM goals WHERE conv = %s", (conv,))
        return goal_row(row) if row else None

    async def save_goal(self, goal: GoalRow | None, conv: str) -> None:
        if goal is None:
            await self.write("DELETE FROM goals WHERE conv = %s", (conv,))
            return
        now = time.time()
        await self.write(
            _GOAL,
            (conv, goal.text, goal.state, goal.auto, goal.max_turns, goal.turns, goal.note, now),
        )

    # --- platform event dedupe, approvals -------------------------------------------

    async def seen(self, channel: str, event_id: str) -> bool:
        row = await self._one(
            "SELECT 1 FROM seen_events WHERE channel = %s AND event_id = %s", (channel, event_id)
        )
        return row is not None

    def mark_seen_soon(self, channel: str, event_id: str) -> None:
        self.write_soon(
            "INSERT INTO seen_events (channel, event_id, at) VALUES (%s, %s, %s) "
            "ON CONFLICT (channel, event_id) DO NOTHING",
            (channel, event_id, time.time()),
        )

    async def mark_seen(self, channel: str, event_id: str) -> None:
        self.mark_seen_soon(channel, event_id)
        await self.flush()

    async def request_approval(self, row: ApprovalRow) -> None:
        asked = (row.id, row.conv, row.run_id, row.call_id, row.tool, row.summary, row.reason)
        await self.write(_APPROVAL, (*asked, "pending", row.requested_at, row.deadline))

    def approval_posted(self, approval_id: str, prompt: PromptRef) -> None:
        body = json.dumps([prompt.channel_id, prompt.message_id, prompt.text])
        self.write_soon("UPDATE approvals SET prompt = %s WHERE id = %s", (body, approval_id))

    async def answer_approval(self, approval_id: str, answer: str, by: str) -> None:
        await self.write(
            "UPDATE approvals SET answer = %s, answered_by = %s "
            "WHERE id = %s AND state = 'pending' AND answer IS NULL",
            (answer, by, approval_id),
        )

    def approval_resolved(self, approval_id: str, state: str) -> None:
        self.write_soon(
            "UPDATE approvals SET state = %s, resolved_at = %s WHERE id = %s",
            (state, time.time(), approval_id),
        )

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        row = await self._one(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = %s", (approval_id,)
        )
        return approval_row(row) if row else None

    async def pending_approval(self, run_id: str, call_id: str) -> ApprovalRow | None:
        row = await self._one(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = %s AND call_id = %s "
            "AND state = 'pending' ORDER BY requested_at DESC LIMIT 1",
            (run_id, call_id),
        )
        return approval_row(row) if row else None

    async def pending_approvals(self, *, before: float) -> list[ApprovalRow]:
        rows = await self._all(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE state = 'pending' "
            "AND requested_at < %s ORDER BY requested_at",
            (before,),
        )
        return [approval_row(r) for r in rows]

    def expire_approvals(self, approval_ids: Iterable[str]) -> None:
        now = time.time()
        for approval_id in approval_ids:
            self.write_soon(
                "UPDATE approvals SET state = 'expired', resolved_at = %s "
                "WHERE id = %s AND state = 'pending'",
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
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (at, run_id, conv, iteration, name, json.dumps(data, default=str)),
        )

    async def events(self, run_id: str) -> list[StoredEvent]:
        rows = await self._all(
            "SELECT at, name, iteration, data FROM events WHERE run_id = %s ORDER BY id",
            (run_id,),
        )
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
