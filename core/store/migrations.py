"""The SQLite schema and its migrations: the schema written once (`schema.py`) in SQLite's
words, each version's script run once, in order, with its `schema_version` row, all in one
transaction (PostgreSQL's words and migrations are `postgres_schema.py`)."""

from __future__ import annotations

import sqlite3

import aiosqlite

from core.store.dialect import SQLITE
from core.store.schema import SCHEMA_VERSION, Spelling

# SQLite's words for the schema (`schema.py`). Long-term memory's index is FTS5 over the
# rows' text, external content (the text is stored once) that the triggers keep in step;
# `seq` is the next after the highest, given at insert under the write lock.
SQLITE_SPELLING = Spelling(
    dialect=SQLITE,
    memories="""
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
    runs_seq="""
    ALTER TABLE runs ADD COLUMN seq INTEGER;
    UPDATE runs SET seq = o.n FROM (
        SELECT rowid AS r, row_number() OVER (ORDER BY created_at, rowid) AS n FROM runs
    ) AS o WHERE runs.rowid = o.r;""",
    audit_log_append_only="""
    CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;""",
    audit_head_follows_the_log="""
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
)
_MIGRATIONS = SQLITE_SPELLING.scripts()


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
