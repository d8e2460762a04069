"""The PostgreSQL schema and its migrations: the same tables, columns and versions as
SQLite's (`migrations.py`), in PostgreSQL's own types (BOOLEAN flags, DOUBLE PRECISION
times, BIGINT counters, identity ids).

Every worker migrates at start-up; two starting at once must not both apply a version.
The whole migration runs in one transaction under a transaction-level advisory lock keyed
by the schema, so the second worker waits, then finds the schema current.
"""

from __future__ import annotations

from psycopg import AsyncConnection

from core.store.migrations import SCHEMA_VERSION

# The advisory lock's first key: "parl" in ASCII; the second is the schema's hash.
_LOCK_CLASS = 0x7061726C

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE conversations (
        key TEXT PRIMARY KEY,
        input_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        last_compaction TEXT,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE messages (
        conv TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (conv, seq)
    );
    CREATE TABLE runs (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, state TEXT NOT NULL, trigger TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION,
        ended_at DOUBLE PRECISION, reason TEXT, text TEXT,
        iterations INTEGER NOT NULL DEFAULT 0,
        input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,
        resumable BOOLEAN NOT NULL DEFAULT FALSE, error TEXT
    );
    CREATE INDEX runs_conv ON runs (conv, created_at);
    CREATE INDEX runs_state ON runs (state);
    CREATE TABLE checkpoints (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        iteration INTEGER NOT NULL, cursor INTEGER NOT NULL, persisted INTEGER NOT NULL,
        prompt_hash TEXT NOT NULL, completed TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE tool_calls (
        run_id TEXT NOT NULL, call_id TEXT NOT NULL, name TEXT NOT NULL,
        arguments TEXT NOT NULL, idempotent BOOLEAN NOT NULL,
        started_at DOUBLE PRECISION NOT NULL, completed_at DOUBLE PRECISION, result TEXT,
        is_error BOOLEAN,
        PRIMARY KEY (run_id, call_id)
    );
    CREATE TABLE journals (
        conv TEXT PRIMARY KEY, body TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE provider_prefs (
        channel TEXT NOT NULL, channel_id TEXT NOT NULL, provider TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (channel, channel_id)
    );
    CREATE TABLE goals (
        conv TEXT PRIMARY KEY, text TEXT NOT NULL, state TEXT NOT NULL,
        auto BOOLEAN NOT NULL DEFAULT FALSE, max_turns INTEGER NOT NULL DEFAULT 0,
        turns INTEGER NOT NULL DEFAULT 0, note TEXT, updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE seen_events (
        channel TEXT NOT NULL, event_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, event_id)
    );
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY, conv TEXT NOT NULL, run_id TEXT, tool TEXT NOT NULL,
        summary TEXT NOT NULL, state TEXT NOT NULL, requested_at DOUBLE PRECISION NOT NULL,
        resolved_at DOUBLE PRECISION
    );
    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at DOUBLE PRECISION NOT NULL,
        run_id TEXT, conv TEXT, iteration INTEGER, name TEXT NOT NULL, data TEXT NOT NULL
    );
    CREATE INDEX events_run ON events (run_id);
    CREATE TABLE job_runs (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, job TEXT NOT NULL,
        fire_time DOUBLE PRECISION NOT NULL, run_id TEXT,
        started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, state TEXT NOT NULL,
        result TEXT, delivered BOOLEAN NOT NULL DEFAULT FALSE, error TEXT,
        UNIQUE (job, fire_time)
    );
    """,
    2: """
    CREATE TABLE tool_groups (
        pgid INTEGER NOT NULL, start_ticks BIGINT NOT NULL, boot_id TEXT NOT NULL,
        PRIMARY KEY (boot_id, pgid)
    );
    """,
    3: """
    ALTER TABLE approvals ADD COLUMN call_id TEXT;
    ALTER TABLE approvals ADD COLUMN reason TEXT NOT NULL DEFAULT '';
    ALTER TABLE approvals ADD COLUMN deadline DOUBLE PRECISION;
    ALTER TABLE approvals ADD COLUMN prompt TEXT;
    ALTER TABLE approvals ADD COLUMN answer TEXT;
    ALTER TABLE approvals ADD COLUMN answered_by TEXT;
    CREATE INDEX approvals_state ON approvals (state);
    """,
    4: """
    ALTER TABLE runs ADD COLUMN worker TEXT;
    CREATE TABLE workers (
        id TEXT PRIMARY KEY, beat_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE leases (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL
    );
    """,
    5: """
    ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
    CREATE INDEX runs_parent ON runs (parent_run_id);
    """,
    # Long-term memory (docs/delegation-memory.md): the rows, with their text's tsvector kept by
    # PostgreSQL
    # itself (a generated column) and a GIN index over it.
    6: """
    CREATE TABLE memories (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, scope_kind TEXT NOT NULL,
        scope_id TEXT NOT NULL, text TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        made_by TEXT NOT NULL DEFAULT '', conv TEXT NOT NULL DEFAULT '',
        tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED
    );
    CREATE INDEX memories_scope ON memories (scope_kind, scope_id, id);
    CREATE INDEX memories_tsv ON memories USING GIN (tsv);
    """,
    # Several workers (docs/scale-out.md): whose tool process groups, and runs by worker.
    7: """
    ALTER TABLE tool_groups ADD COLUMN worker TEXT;
    CREATE INDEX runs_worker ON runs (worker, state);
    """,
    # Runs in the order they were stored, whatever the clock of the worker that stored
    # them (docs/scale-out.md): `seq`, taken from the server's sequence at insert. Existing runs
    # keep the order they had, by `created_at` (renumbered before nobody may set it).
    8: """
    ALTER TABLE runs ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY;
    UPDATE runs SET seq = o.n FROM (
        SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM runs
    ) AS o WHERE runs.id = o.id;
    ALTER TABLE runs ALTER COLUMN seq SET GENERATED ALWAYS;
    CREATE UNIQUE INDEX runs_seq ON runs (seq);
    DROP INDEX runs_conv;
    CREATE INDEX runs_conv ON runs (conv, seq);
    """,
    # The answer a run owes its conversation until the platform took it (docs/durability.md).
    9: """
    ALTER TABLE runs ADD COLUMN reply TEXT;
    CREATE INDEX runs_reply ON runs (worker) WHERE reply IS NOT NULL;
    """,
    # The instruction file an approver chose for a chat (`/instructions set`).
    10: """
    CREATE TABLE instruction_prefs (
        channel TEXT NOT NULL, channel_id TEXT NOT NULL, name TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (channel, channel_id)
    );
    """,
    # Whose a scheduled job's fire is while it runs.
    11: """
    ALTER TABLE job_runs ADD COLUMN worker TEXT;
    CREATE INDEX job_runs_running ON job_runs (state, worker);
    """,
    # Durable approvals ("approve always", `/grants`).
    12: """
    CREATE TABLE grants (
        id TEXT PRIMARY KEY, scope TEXT NOT NULL, key TEXT NOT NULL, tool TEXT NOT NULL,
        granted_by TEXT NOT NULL, granted_at DOUBLE PRECISION NOT NULL
    );
    CREATE UNIQUE INDEX grants_key_tool ON grants (key, tool);
    """,
    # Priced usage and budgets (docs/cost.md).
    13: """
    CREATE TABLE llm_calls (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at DOUBLE PRECISION NOT NULL,
        run_id TEXT NOT NULL, conv TEXT NOT NULL, user_id TEXT NOT NULL, channel TEXT NOT NULL,
        job TEXT NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL,
        input_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL,
        cache_write_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
        cost DOUBLE PRECISION, estimated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX llm_calls_at ON llm_calls (at);
    CREATE INDEX llm_calls_conv ON llm_calls (conv, at);
    CREATE TABLE budget_spend (
        key TEXT PRIMARY KEY, spent DOUBLE PRECISION NOT NULL DEFAULT 0,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE budget_limits (
        name TEXT PRIMARY KEY, amount DOUBLE PRECISION NOT NULL, set_by TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # The audit log (docs/governance.md#the-audit-log): append-only, hash-chained; its
    # head row holds the last row's number and hash (an append locks it: FOR UPDATE).
    14: """
    CREATE TABLE audit_log (
        seq BIGINT PRIMARY KEY, at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
        actor TEXT NOT NULL, conv TEXT NOT NULL, detail TEXT NOT NULL, prev TEXT NOT NULL,
        hash TEXT NOT NULL
    );
    CREATE INDEX audit_log_at ON audit_log (at);
    CREATE TABLE audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, hash TEXT NOT NULL
    );
    INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '');
    CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
    CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
    CREATE TABLE run_senders (
        run_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        groups TEXT NOT NULL
    );
    """,
    # The audit log's head is kept like its rows (docs/governance.md#the-audit-log): never
    # deleted nor inserted again, and moved only to the row just appended after it. Row
    # triggers do not fire on TRUNCATE: a statement trigger refuses it on both tables.
    15: """
    CREATE FUNCTION audit_head_follows_the_log() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'UPDATE' THEN
            RAISE EXCEPTION 'the audit log is append-only';
        END IF;
        IF NEW.id IS DISTINCT FROM OLD.id OR NEW.seq IS DISTINCT FROM OLD.seq + 1
            OR NOT EXISTS (SELECT 1 FROM audit_log
                           WHERE seq = NEW.seq AND prev = OLD.hash AND hash = NEW.hash) THEN
            RAISE EXCEPTION 'the audit head only moves to the row appended after it';
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER audit_head_follows_the_log BEFORE INSERT OR UPDATE OR DELETE ON audit_head
    FOR EACH ROW EXECUTE FUNCTION audit_head_follows_the_log();
    CREATE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON audit_head
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
    CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
    """,
}
assert sorted(_MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1)), "one script per version"


async def migrate(conn: AsyncConnection[tuple[object, ...]]) -> None:
    """Bring the schema `conn` works in (its `search_path`) up to `SCHEMA_VERSION`, in one
    transaction, while no other worker migrates it; refuse one from a newer Parley."""
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK_CLASS,)
        )
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        cursor = await conn.execute("SELECT MAX(version) FROM schema_version")
        row = await cursor.fetchone()
        current = int(str(row[0])) if row and row[0] is not None else 0
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database is from a newer Parley (schema {current} > {SCHEMA_VERSION}); "
                "upgrade Parley or point [store] url at another database or schema"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.execute(_MIGRATIONS[version].encode())  # no parameters: several statements
            await conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
