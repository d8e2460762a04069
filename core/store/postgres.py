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
coordinate through, `postgres_memory.py` long-term memory, `conversation_tables.py` the
rest, this module `open`; `postgres_schema.py` spells and migrates the schema (`schema.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import psycopg
from psycopg.errors import TransactionRollback

from core.errors import ConfigError, StoreError
from core.store.audit_tables import PostgresAuditTables
from core.store.conversation_tables import POSTGRES_CONVERSATIONS, ConversationTables
from core.store.grant_tables import POSTGRES_GRANTS, GrantTables
from core.store.postgres_db import connection_kwargs, open_pool, where
from core.store.postgres_memory import PostgresMemoryTables
from core.store.postgres_schema import migrate
from core.store.postgres_workers import PostgresWorkerTables
from core.store.sender_tables import POSTGRES_SENDERS, SenderTables
from core.store.trigger_tables import POSTGRES_TRIGGERS, PostgresTriggerTables
from core.store.usage_rows import Refused, Want
from core.store.usage_tables import POSTGRES_USAGE, UsageTables, refusal

_SPENT_FOR_UPDATE = (
    "SELECT key, spent FROM budget_spend WHERE key = ANY(%s) ORDER BY key FOR UPDATE"
)
_ATTEMPTS = 3  # a reservation another worker's deadlock rolled back is tried again


class PostgresStore(
    PostgresWorkerTables,
    PostgresMemoryTables,
    PostgresAuditTables,
    SenderTables,
    PostgresTriggerTables,
    GrantTables,
    UsageTables,
    ConversationTables,
):
    """One PostgreSQL database (or schema); open with `await PostgresStore.open(url)` (or
    `core.store.open_store`), close with `aclose()`."""

    _grant_sql = POSTGRES_GRANTS
    _sender_sql = POSTGRES_SENDERS
    _trigger_sql = POSTGRES_TRIGGERS
    _conv_sql = POSTGRES_CONVERSATIONS
    _usage_sql = POSTGRES_USAGE

    async def reserve_budget(self, wants: Sequence[Want]) -> Refused | None:
        """One transaction that locks the periods' rows (in key order, so two workers
        never deadlock over them): a second worker waits, then sees the first's spend."""
        if not wants:
            return None
        await self.committed()
        # Its own task: a caller cancelled meanwhile must not cut the transaction off.
        return await asyncio.shield(asyncio.ensure_future(self._reserve(sorted(wants))))

    async def _reserve(self, ordered: list[Want]) -> Refused | None:
        keys = [key for key, _, _ in ordered]
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    now = time.time()
                    for key in keys:
                        await conn.execute(POSTGRES_USAGE.new_period, (key, now))
                    cursor = await conn.execute(_SPENT_FOR_UPDATE, (keys,))
                    spent = {str(k): float(v) for k, v in await cursor.fetchall()}
                    if (refused := refusal(ordered, spent)) is not None:
                        return refused
                    for key, amount, _ in ordered:
                        await conn.execute(POSTGRES_USAGE.add, (amount, now, key))
                    return None
            except TransactionRollback:
                if attempt == _ATTEMPTS:
                    raise
            except psycopg.Error as exc:
                raise StoreError(f"a budget reservation failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

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
