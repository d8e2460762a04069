"""The SQLite schema and its migrations: each version's script runs once, in order, with
its `schema_version` row, all in one transaction. `SCHEMA_VERSION` numbers the schema of
every backend (PostgreSQL's is `postgres_schema.py`)."""

from __future__ import annotations

import sqlite3

import aiosqlite

SCHEMA_VERSION = 15

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
    4: """
    ALTER TABLE runs ADD COLUMN worker TEXT;
    CREATE TABLE workers (
        id TEXT PRIMARY KEY, beat_at REAL NOT NULL, started_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE leases (
        name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    5: """
    ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
    CREATE INDEX runs_parent ON runs (parent_run_id);
    """,
    # Long-term memory (docs/delegation-memory.md): the rows, and an FTS5 index over their text
    # that the
    # triggers keep in step (external content: the text is stored once).
    6: """
    CREATE TABLE memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT, scope_kind TEXT NOT NULL,
        scope_id TEXT NOT NULL, text TEXT NOT NULL, created_at REAL NOT NULL,
        made_by TEXT NOT NULL DEFAULT '', conv TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX memories_scope ON memories (scope_kind, scope_id, id);
    CREATE VIRTUAL TABLE memories_fts USING fts5(
        text, content='memories', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER memories_added AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER memories_removed AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END;
    CREATE TRIGGER memories_changed AFTER UPDATE OF text ON memories BEGIN
        INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', old.id, old.text);
        INSERT INTO memories_fts (rowid, text) VALUES (new.id, new.text);
    END;
    """,
    # Several workers (docs/scale-out.md): whose tool process groups, and runs by worker.
    7: """
    ALTER TABLE tool_groups ADD COLUMN worker TEXT;
    CREATE INDEX runs_worker ON runs (worker, state);
    """,
    # Runs in the order they were stored, whatever the clock of the worker that stored
    # them (docs/scale-out.md): `seq`, given at insert (the next after the highest, under the write
    # lock). Existing runs keep the order they had, by `created_at`.
    8: """
    ALTER TABLE runs ADD COLUMN seq INTEGER;
    UPDATE runs SET seq = o.n FROM (
        SELECT rowid AS r, row_number() OVER (ORDER BY created_at, rowid) AS n FROM runs
    ) AS o WHERE runs.rowid = o.r;
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
        updated_at REAL NOT NULL, PRIMARY KEY (channel, channel_id)
    ) WITHOUT ROWID;
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
        granted_by TEXT NOT NULL, granted_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX grants_key_tool ON grants (key, tool);
    """,
    # Priced usage and budgets (docs/cost.md): one row per LLM call, each budget
    # period's spend, and the limits an admin set with `/budget`.
    13: """
    CREATE TABLE llm_calls (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, run_id TEXT NOT NULL,
        conv TEXT NOT NULL, user_id TEXT NOT NULL, channel TEXT NOT NULL, job TEXT NOT NULL,
        provider TEXT NOT NULL, model TEXT NOT NULL, input_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL, cache_write_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL, cost REAL, estimated INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX llm_calls_at ON llm_calls (at);
    CREATE INDEX llm_calls_conv ON llm_calls (conv, at);
    CREATE TABLE budget_spend (
        key TEXT PRIMARY KEY, spent REAL NOT NULL DEFAULT 0, updated_at REAL NOT NULL
    );
    CREATE TABLE budget_limits (
        name TEXT PRIMARY KEY, amount REAL NOT NULL, set_by TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # The audit log (docs/governance.md#the-audit-log): append-only, hash-chained; its
    # head row holds the last row's number and hash (an append locks it).
    14: """
    CREATE TABLE audit_log (
        seq INTEGER PRIMARY KEY, at REAL NOT NULL, kind TEXT NOT NULL, actor TEXT NOT NULL,
        conv TEXT NOT NULL, detail TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL
    );
    CREATE INDEX audit_log_at ON audit_log (at);
    CREATE TABLE audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, hash TEXT NOT NULL
    );
    INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '');
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TABLE run_senders (
        run_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, user_name TEXT NOT NULL,
        groups TEXT NOT NULL
    );
    """,
    # The audit log's head is kept like its rows (docs/governance.md#the-audit-log): never
    # deleted nor inserted again, and moved only to the row just appended after it.
    15: """
    CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_head
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_head_no_insert BEFORE INSERT ON audit_head
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_head_follows_the_log BEFORE UPDATE ON audit_head
    WHEN NEW.id IS NOT OLD.id OR NEW.seq IS NOT OLD.seq + 1 OR NOT EXISTS (
        SELECT 1 FROM audit_log WHERE seq = NEW.seq AND prev = OLD.hash AND hash = NEW.hash
    )
    BEGIN SELECT RAISE(ABORT, 'the audit head only moves to the row appended after it'); END;
    """,
}


async def migrate(conn: aiosqlite.Connection) -> None:
    """Bring the database up to `SCHEMA_VERSION`; refuse one from a newer Parley.

    One transaction that takes the write lock before it reads the version again: of two
    processes opening a new file at once, the second waits (`busy_timeout`), then finds
    the schema current. A current schema takes no lock."""
    if await _version(conn) == SCHEMA_VERSION:
        return
    await conn.execute("BEGIN IMMEDIATE")
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        current = await _version(conn)
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"the database is from a newer Parley (schema {current} > {SCHEMA_VERSION}); "
                "upgrade Parley or point [store] path at another file"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in statements(_MIGRATIONS[version]):
                await _execute(conn, statement)
            await conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        await conn.execute("COMMIT")
    except BaseException:
        await conn.execute("ROLLBACK")
        raise


async def _execute(conn: aiosqlite.Connection, statement: str) -> None:
    try:
        await conn.execute(statement)
    except sqlite3.OperationalError as exc:
        if "fts5" in str(exc):  # a SQLite built without it: say what to do instead
            raise RuntimeError(
                "this Python's SQLite has no FTS5, which long-term memory's index needs; "
                "use a Python whose sqlite3 has it (python.org and distribution builds do) "
                "or a PostgreSQL store"
            ) from exc
        raise


def statements(script: str) -> list[str]:
    """The statements of `script`, one by one: split at each `;` that ends a complete
    statement (a trigger's body holds `;`s of its own)."""
    found: list[str] = []
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                found.append(pending.strip())
            pending = ""
    if pending.strip(" \n;"):
        found.append(pending.strip())
    return found


async def _version(conn: aiosqlite.Connection) -> int:
    """The schema's version: 0 for a new database."""
    try:
        async with conn.execute("SELECT MAX(version) FROM schema_version") as cursor:
            row = await cursor.fetchone()
    except sqlite3.OperationalError:  # no such table
        return 0
    return int(row[0]) if row and row[0] is not None else 0
