"""The store's schema, written once for both backends: every version's script, in order,
with the few words each backend spells its own way left as `{names}`.

Column types are spellings (`_TYPES`: a time is SQLite's REAL and PostgreSQL's DOUBLE
PRECISION, a flag INTEGER or BOOLEAN); what a backend does differently — long-term
memory's full-text index, the runs' sequence, the audit log's append-only triggers — is a
block of its own statements, written in its `Spelling` in its module (`migrations.py` for
SQLite, `postgres_schema.py` for PostgreSQL), which also runs the scripts.

The scripts keep SQLite's layout, line for line: SQLite stores each CREATE statement's
text as written, so a new file's schema reads as it always did.
"""

from __future__ import annotations

from core.records import record
from core.store.dialect import Dialect

SCHEMA_VERSION = 17


# The column types, as each backend spells them: (SQLite's, PostgreSQL's).
_TYPES: dict[str, tuple[str, str]] = {
    "real": ("REAL", "DOUBLE PRECISION"),  # times in seconds since the epoch, amounts
    "bigint": ("INTEGER", "BIGINT"),  # may outgrow 32 bits: token counts, ticks, `seq`
    "flag": ("INTEGER", "BOOLEAN"),
    "false": ("0", "FALSE"),  # a flag's default
    "identity": (  # a numbered primary key the database gives at insert
        "INTEGER PRIMARY KEY AUTOINCREMENT",
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    ),
    "without_rowid": (" WITHOUT ROWID", ""),  # ends a table keyed by its primary key alone
}


@record(frozen=True)
class Spelling:
    """One backend's schema: its dialect (which gives the column types' words) and the
    blocks of statements it writes its own way, each beginning with a new line.

    Attributes:
        dialect: the backend's `Dialect`.
        memories: version 6, long-term memory's table and its full-text index.
        runs_seq: version 8's first statements: `runs.seq` added and numbered.
        audit_log_append_only: what refuses an update or delete of the audit log.
        audit_head_follows_the_log: version 15, what keeps the audit log's head row.
    """

    dialect: Dialect
    memories: str
    runs_seq: str
    audit_log_append_only: str
    audit_head_follows_the_log: str

    def scripts(self) -> dict[int, str]:
        """Every version's script in this backend's words."""
        column = 0 if self.dialect.name == "sqlite" else 1
        words = {name: spelt[column] for name, spelt in _TYPES.items()}
        words.update(
            memories=self.memories,
            runs_seq=self.runs_seq,
            audit_log_append_only=self.audit_log_append_only,
            audit_head_follows_the_log=self.audit_head_follows_the_log,
        )
        return {version: script.format_map(words) for version, script in _SCRIPTS.items()}


_SCRIPTS: dict[int, str] = {
    1: """
    CREATE TABLE conversations (
        key TEXT PRIMARY KEY,
        input_tokens {bigint} NOT NULL DEFAULT 0,
        output_tokens {bigint} NOT NULL DEFAULT 0,
        last_compaction TEXT,
        updated_at {real} NOT NULL
    );
    CREATE TABLE messages (
        conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (conv, seq)
    ){without_rowid};
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, state TEXT NOT NULL, trigger TEXT NOT NULL,
        created_at {real} NOT NULL, started_at {real}, ended_at {real},
        reason TEXT, text TEXT, iterations INTEGER NOT NULL DEFAULT 0,
        input_tokens {bigint} NOT NULL DEFAULT 0, output_tokens {bigint} NOT NULL DEFAULT 0,
        resumable {flag} NOT NULL DEFAULT {false}, error TEXT
    );
    CREATE INDEX runs_conv ON runs (conv, created_at);
    CREATE INDEX runs_state ON runs (state);
    CREATE TABLE checkpoints (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        iteration INTEGER NOT NULL, cursor INTEGER NOT NULL, persisted INTEGER NOT NULL,
        prompt_hash TEXT NOT NULL, completed TEXT NOT NULL, at {real} NOT NULL,
        PRIMARY KEY (run_id, seq)
    ){without_rowid};
    CREATE TABLE tool_calls (
        run_id TEXT NOT NULL, call_id TEXT NOT NULL, name TEXT NOT NULL,
        arguments TEXT NOT NULL, idempotent {flag} NOT NULL,
        started_at {real} NOT NULL, completed_at {real}, result TEXT, is_error {flag},
        PRIMARY KEY (run_id, call_id)
    ){without_rowid};
    CREATE TABLE journals (conv TEXT PRIMARY KEY, body TEXT NOT NULL, updated_at {real} NOT NULL);
    CREATE TABLE provider_prefs (
        channel TEXT NOT NULL, channel_id TEXT NOT NULL, provider TEXT NOT NULL,
        updated_at {real} NOT NULL, PRIMARY KEY (channel, channel_id)
    ){without_rowid};
    CREATE TABLE goals (
        conv TEXT PRIMARY KEY, text TEXT NOT NULL, state TEXT NOT NULL,
        auto {flag} NOT NULL DEFAULT {false}, max_turns INTEGER NOT NULL DEFAULT 0,
        turns INTEGER NOT NULL DEFAULT 0, note TEXT, updated_at {real} NOT NULL
    );
    CREATE TABLE seen_events (
        channel TEXT NOT NULL, event_id TEXT NOT NULL, at {real} NOT NULL,
        PRIMARY KEY (channel, event_id)
    ){without_rowid};
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, run_id TEXT, tool TEXT NOT NULL,
        summary TEXT NOT NULL, state TEXT NOT NULL, requested_at {real} NOT NULL,
        resolved_at {real}
    );
    CREATE TABLE events (
        id {identity}, at {real} NOT NULL, run_id TEXT, conv TEXT,
        iteration INTEGER, name TEXT NOT NULL, data TEXT NOT NULL
    );
    CREATE INDEX events_run ON events (run_id);
    CREATE TABLE job_runs (
        id {identity}, job TEXT NOT NULL, fire_time {real} NOT NULL,
        run_id TEXT, started_at {real} NOT NULL, ended_at {real}, state TEXT NOT NULL,
        result TEXT, delivered {flag} NOT NULL DEFAULT {false}, error TEXT,
        UNIQUE (job, fire_time)
    );
    """,
    2: """
    CREATE TABLE tool_groups (
        pgid INTEGER NOT NULL, start_ticks {bigint} NOT NULL, boot_id TEXT NOT NULL,
        PRIMARY KEY (boot_id, pgid)
    ){without_rowid};
    """,
    3: """
    ALTER TABLE approvals ADD COLUMN call_id TEXT;
    ALTER TABLE approvals ADD COLUMN reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE approvals ADD COLUMN deadline {real};
    ALTER TABLE approvals ADD COLUMN prompt TEXT;
    ALTER TABLE approvals ADD COLUMN answer TEXT;
    ALTER TABLE approvals ADD COLUMN answered_by TEXT;
    CREATE INDEX approvals_state ON approvals (state);
    """,
    4: """
    ALTER TABLE runs ADD COLUMN worker TEXT;
    CREATE TABLE workers (
        id TEXT PRIMARY KEY, beat_at {real} NOT NULL, started_at {real} NOT NULL
    ){without_rowid};
    CREATE TABLE leases (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at {real} NOT NULL
    ){without_rowid};
    """,
    5: """
    ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
    CREATE INDEX runs_parent ON runs (parent_run_id);
    """,
    # Long-term memory (docs/delegation-memory.md): the rows, and each backend's full-text
    # index over their text.
    6: "{memories}",
    # Several workers (docs/scale-out.md): whose tool process groups, and runs by worker.
    7: """
    ALTER TABLE tool_groups ADD COLUMN worker TEXT;
    CREATE INDEX runs_worker ON runs (worker, state);
    """,
    # Runs in the order they were stored, whatever the clock of the worker that stored
    # them (docs/scale-out.md): `seq`, given at insert. Existing runs keep the order they
    # had, by `created_at`.
    8: """{runs_seq}
    CREATE UNIQUE INDEX runs_seq ON runs (seq);
    DROP INDEX runs_conv;
    CREATE INDEX runs_conv ON runs (conv, seq);
    """,
    # The answer a run owes its conversation until the platform took it (docs/durability.md): a
    # crash between the run's end and the post leaves it to recovery, not lost.
    9: """
    ALTER TABLE runs ADD COLUMN reply TEXT;
    CREATE INDEX runs_reply ON runs (worker) WHERE reply IS NOT NULL;
    """,
    # The instruction file an approver chose for a chat (`/instructions set`).
    10: """
    CREATE TABLE instruction_prefs (
        channel TEXT NOT NULL, channel_id TEXT NOT NULL, name TEXT NOT NULL,
        updated_at {real} NOT NULL, PRIMARY KEY (channel, channel_id)
    ){without_rowid};
    """,
    # Whose a scheduled job's fire is while it runs: a fire whose worker died is
    # taken over, and one a worker lost is no longer finished by it.
    11: """
    ALTER TABLE job_runs ADD COLUMN worker TEXT;
    CREATE INDEX job_runs_running ON job_runs (state, worker);
    """,
    # Durable approvals ("approve always", `/grants`): a tool that runs without asking in
    # a conversation or a channel.
    12: """
    CREATE TABLE grants (
        id TEXT PRIMARY KEY, scope TEXT NOT NULL, key TEXT NOT NULL, tool TEXT NOT NULL,
        granted_by TEXT NOT NULL, granted_at {real} NOT NULL
    );
    CREATE UNIQUE INDEX grants_key_tool ON grants (key, tool);
    """,
    # Priced usage and budgets (docs/cost.md): one row per LLM call, each budget
    # period's spend, and the limits an admin set with `/budget`.
    13: """
    CREATE TABLE llm_calls (
        id {identity}, at {real} NOT NULL, run_id TEXT NOT NULL,
        conv TEXT NOT NULL, user_id TEXT NOT NULL, channel TEXT NOT NULL, job TEXT NOT NULL,
        provider TEXT NOT NULL, model TEXT NOT NULL, input_tokens {bigint} NOT NULL,
        cached_tokens {bigint} NOT NULL, cache_write_tokens {bigint} NOT NULL,
        output_tokens {bigint} NOT NULL, cost {real}, estimated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX llm_calls_at ON llm_calls (at);
    CREATE INDEX llm_calls_conv ON llm_calls (conv, at);
    CREATE TABLE budget_spend (
        key TEXT PRIMARY KEY, spent {real} NOT NULL DEFAULT 0, updated_at {real} NOT NULL
    );
    CREATE TABLE budget_limits (
        name TEXT PRIMARY KEY, amount {real} NOT NULL, set_by TEXT NOT NULL,
        updated_at {real} NOT NULL
    );
    """,
    # The audit log (docs/governance.md#the-audit-log): append-only, hash-chained; its
    # head row holds the last row's number and hash (an append locks it).
    14: """
    CREATE TABLE audit_log (
        seq {bigint} PRIMARY KEY, at {real} NOT NULL, kind TEXT NOT NULL, actor TEXT NOT NULL,
        conv TEXT NOT NULL, detail TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL
    );
    CREATE INDEX audit_log_at ON audit_log (at);
    CREATE TABLE audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq {bigint} NOT NULL, hash TEXT NOT NULL
    );
    INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '');{audit_log_append_only}
    CREATE TABLE run_senders (
        run_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        groups TEXT NOT NULL
    );
    """,
    # The audit log's head is kept like its rows (docs/governance.md#the-audit-log): never
    # deleted nor inserted again, and moved only to the row just appended after it.
    15: "{audit_head_follows_the_log}",
    # Trigger deliveries (docs/triggers.md#deliveries-in-the-store): one row per (trigger,
    # delivery id) taken in, so a redelivery to any worker is told from a new one; purged
    # by `received_at` once the dedupe window has passed.
    16: """
    CREATE TABLE trigger_deliveries (
        trigger TEXT NOT NULL, delivery_id TEXT NOT NULL, received_at {real} NOT NULL,
        event_type TEXT NOT NULL, outcome TEXT NOT NULL, run_id TEXT,
        PRIMARY KEY (trigger, delivery_id)
    ){without_rowid};
    CREATE INDEX trigger_deliveries_at ON trigger_deliveries (received_at);
    CREATE INDEX trigger_deliveries_last ON trigger_deliveries (trigger, received_at);
    """,
    # Triggers' threads (docs/triggers.md#one-thread-per-key): the open correlations (a
    # trigger's rendered `thread_by` key → its conversation, gone once `close_on` closed
    # it); where each trigger conversation posts (its platform thread once opened, and
    # that thread's own conversation key, by which people's replies find it); and each
    # trigger's deliveries per minute, counted by every worker in one row.
    17: """
    CREATE TABLE trigger_threads (
        trigger TEXT NOT NULL, thread_key TEXT NOT NULL, conv TEXT NOT NULL,
        opened_at {real} NOT NULL, PRIMARY KEY (trigger, thread_key)
    ){without_rowid};
    CREATE TABLE platform_threads (
        conv TEXT PRIMARY KEY, place TEXT NOT NULL, header TEXT NOT NULL, thread TEXT,
        alias TEXT UNIQUE
    );
    CREATE TABLE trigger_rate (
        trigger TEXT NOT NULL, minute {bigint} NOT NULL, count {bigint} NOT NULL,
        PRIMARY KEY (trigger, minute)
    ){without_rowid};
    """,
}
assert sorted(_SCRIPTS) == list(range(1, SCHEMA_VERSION + 1)), "one script per version"
