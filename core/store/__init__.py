"""Parley's durable state behind one seam (docs/durability.md, docs/scale-out.md).

`Store` is a `typing.Protocol` made of narrower ones, one per concern (`RunStore`,
`MessageStore`, `JournalStore`, `PreferenceStore`, `DedupeStore`, `ApprovalStore`,
`EventStore`, `JobStore`, `WorkerStore`, `MemoryStore`); core depends on those.
`open_store(path_or_url)` opens one: `SqliteStore`, the embedded implementation, or
`core.store.postgres.PostgresStore`, the one several workers share (imported only when
opened: psycopg is the `postgres` extra). Both offer raw `write`/`write_soon` for tests and
benchmarks that need SQL. `tests/store/` holds every backend to the protocol.

    protocol.py     the seam and what each method promises
    rows.py         the values it hands back, and how each is built from its columns
    writes.py       queued writes' owners and the failed-write count, for every backend
    group_commit.py the queue and writer task every backend commits through
    backends.py     open_store: a path or URL to a backend
    dialect.py      the few spellings in which the two backends' SQL differs
                    (placeholders, typed NULL parameters, IS vs IS NOT DISTINCT FROM,
                    upserts, LIKE/ILIKE, IN lists, the runs sequence, the clock)
    run_tables.py, worker_tables.py, conversation_tables.py, memory_tables.py,
    grant_tables.py, usage_tables.py, trigger_tables.py
                    every statement written once, spelt per dialect at import, and the
                    methods over them that both backends share
    schema.py       the schema written once: every version's script, with the column
                    types and the few blocks each backend spells its own way
    sqlite.py       SqliteStore (sqlite_db.py: connections and the batch commit;
                    sqlite_runs.py, sqlite_workers.py, sqlite_memory.py: what SQLite
                    does its own way — the take-in, the hand-out and take-over of
                    runs, full-text search; migrations.py: its spelling of the schema
                    and the migration under its write lock)
    postgres.py     PostgresStore (postgres_db.py: the pool and the batch commit;
                    postgres_runs.py, postgres_workers.py, postgres_memory.py: the
                    same, with SKIP LOCKED and tsvector; postgres_schema.py: its
                    spelling and the migration under an advisory lock; notify.py:
                    LISTEN/NOTIFY, which only PostgreSQL has)
    memory_rows.py  memories' scopes and rows, and the query terms both backends match
    audit_rows.py   the audit log's rows, hash chain and SQL (audit_tables.py:
                    the methods; the append per backend, under the chain's lock)
    grant_rows.py   durable approvals ("approve always") and their SQL
                    (grant_tables.py: the methods, for both backends)
    trigger_rows.py trigger deliveries and the `TriggerStore` dedupe seam
                    (trigger_tables.py: the methods, for both backends)
    usage_rows.py   priced LLM calls and budget periods (usage_tables.py: for both
                    backends; the reservation's transaction is each backend's own)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy import lazy_names

if TYPE_CHECKING:
    from core.store.audit_rows import AuditRow
    from core.store.backends import open_store
    from core.store.grant_rows import GrantRow, GrantScope
    from core.store.memory_rows import MemoryRow, Scope, ScopeKind
    from core.store.protocol import (
        ApprovalStore,
        AuditStore,
        DedupeStore,
        EventStore,
        GrantStore,
        JobStore,
        JournalStore,
        MemoryStore,
        MessageStore,
        PreferenceStore,
        RunStore,
        SharedStore,
        Store,
        WorkerStore,
    )
    from core.store.queue_protocol import WorkerState
    from core.store.rows import (
        ApprovalRow,
        Checkpoint,
        ConversationRow,
        GoalRow,
        JobRunRecord,
        OwedReply,
        RunRow,
        StoredEvent,
        ToolCallRow,
    )
    from core.store.sqlite import SqliteStore
    from core.store.trigger_rows import TriggerDelivery, TriggerStore
    from core.store.usage_rows import LlmCall, Refused, UsageStore
    from core.store.writes import failed_writes, write_for

# Each name is imported from its module on first use (PEP 562): a process that needs only
# a row type or a scope does not load the backends and their SQL (`parley chat -m` loads
# no store at all; docs/benchmarks.md).
_HOMES = {
    "AuditRow": "audit_rows",
    "open_store": "backends",
    "GrantRow": "grant_rows",
    "GrantScope": "grant_rows",
    "MemoryRow": "memory_rows",
    "Scope": "memory_rows",
    "ScopeKind": "memory_rows",
    **dict.fromkeys(
        (
            "ApprovalStore",
            "AuditStore",
            "DedupeStore",
            "EventStore",
            "GrantStore",
            "JobStore",
            "JournalStore",
            "MemoryStore",
            "MessageStore",
            "PreferenceStore",
            "RunStore",
            "SharedStore",
            "Store",
            "WorkerStore",
        ),
        "protocol",
    ),
    **dict.fromkeys(
        (
            "ApprovalRow",
            "Checkpoint",
            "ConversationRow",
            "GoalRow",
            "JobRunRecord",
            "OwedReply",
            "RunRow",
            "StoredEvent",
            "ToolCallRow",
        ),
        "rows",
    ),
    "SqliteStore": "sqlite",
    "WorkerState": "queue_protocol",
    **dict.fromkeys(("TriggerDelivery", "TriggerStore"), "trigger_rows"),
    **dict.fromkeys(("LlmCall", "Refused", "UsageStore"), "usage_rows"),
    "failed_writes": "writes",
    "write_for": "writes",
}


__getattr__ = lazy_names(__name__, _HOMES)


__all__ = [
    "ApprovalRow",
    "ApprovalStore",
    "AuditRow",
    "AuditStore",
    "Checkpoint",
    "ConversationRow",
    "DedupeStore",
    "EventStore",
    "GoalRow",
    "GrantRow",
    "GrantScope",
    "GrantStore",
    "JobRunRecord",
    "JobStore",
    "JournalStore",
    "LlmCall",
    "MemoryRow",
    "MemoryStore",
    "MessageStore",
    "OwedReply",
    "PreferenceStore",
    "Refused",
    "RunRow",
    "RunStore",
    "Scope",
    "ScopeKind",
    "SharedStore",
    "SqliteStore",
    "Store",
    "StoredEvent",
    "ToolCallRow",
    "TriggerDelivery",
    "TriggerStore",
    "UsageStore",
    "WorkerState",
    "WorkerStore",
    "failed_writes",
    "open_store",
    "write_for",
]
