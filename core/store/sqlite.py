"""Parley's durable state on SQLite (WAL): `SqliteStore`, the embedded `Store`.

The methods are split by concern like the protocol: `sqlite_db.py` holds the connections
and the group commit, `sqlite_runs.py` runs and jobs, `sqlite_workers.py` what workers
coordinate through, `sqlite_memory.py` long-term memory, `conversation_tables.py` the rest,
this module `open`; `migrations.py` spells and migrates the schema (`schema.py`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from core.store.audit_tables import SqliteAuditTables
from core.store.conversation_tables import SQLITE_CONVERSATIONS, ConversationTables
from core.store.grant_tables import SQLITE_GRANTS, GrantTables
from core.store.migrations import migrate
from core.store.sender_tables import SQLITE_SENDERS, SenderTables
from core.store.sqlite_db import BUSY_TIMEOUT_MS, reader_connection, writer_connection
from core.store.sqlite_memory import SqliteMemoryTables
from core.store.sqlite_workers import SqliteWorkerTables
from core.store.trigger_tables import SQLITE_TRIGGERS, SqliteTriggerTables
from core.store.usage_rows import Refused, Want
from core.store.usage_tables import SQLITE_USAGE, UsageTables, refusal


class SqliteStore(
    SqliteWorkerTables,
    SqliteMemoryTables,
    SqliteAuditTables,
    SenderTables,
    SqliteTriggerTables,
    GrantTables,
    UsageTables,
    ConversationTables,
):
    """One SQLite database; open with `await SqliteStore.open(path)` (or
    `core.store.open_store`), close with `aclose()`."""

    _grant_sql = SQLITE_GRANTS
    _sender_sql = SQLITE_SENDERS
    _trigger_sql = SQLITE_TRIGGERS
    _conv_sql = SQLITE_CONVERSATIONS
    _usage_sql = SQLITE_USAGE

    async def reserve_budget(self, wants: Sequence[Want]) -> Refused | None:
        """One transaction under the write lock: every process sharing the file agrees."""
        if not wants:
            return None
        ordered = sorted(wants)
        keys = [key for key, _, _ in ordered]
        spent_sql = (
            f"SELECT key, spent FROM budget_spend WHERE key IN ({', '.join('?' * len(keys))})"
        )

        def work(conn: sqlite3.Connection) -> list[Any]:
            now = time.time()
            for key in keys:
                conn.execute(SQLITE_USAGE.new_period, (key, now))
            spent = {str(k): float(v) for k, v in conn.execute(spent_sql, keys).fetchall()}
            if (refused := refusal(ordered, spent)) is not None:
                return [refused]
            for key, amount, _ in ordered:
                conn.execute(SQLITE_USAGE.add, (amount, now, key))
            return []

        result = await self._write_now_with(work, "a budget reservation")
        return result[0] if result else None

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
