"""What SQLite does its own way in `WorkerStore` (`worker_tables.py` has the rest): a
queued run handed out, and a dead worker's runs taken over. SQLite is one machine's store,
so its clock is `time.time()`, read once the write lock is held; each is one transaction
under that lock, so processes sharing the file agree."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

from core.store.rows import RUN_COLUMNS, RunRow, run_row
from core.store.sqlite_runs import SqliteRunTables
from core.store.worker_tables import SQLITE_WORKERS, WorkerTables

_CLAIM_QUEUED_RUN = f"""
UPDATE runs SET state = 'running', started_at = ?, worker = ?
WHERE id = (
    SELECT q.id FROM runs q
    WHERE q.state = 'queued' AND q.worker IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM runs r
          WHERE r.conv = q.conv
            AND (r.state = 'running' OR r.reply IS NOT NULL
                 OR (r.state = 'waiting_on_human' AND r.resumable))
      )
    ORDER BY q.seq
    LIMIT 1
)
RETURNING {RUN_COLUMNS}
"""
_HAS_CHECKPOINT = "EXISTS (SELECT 1 FROM checkpoints c WHERE c.run_id = runs.id)"
_REQUEUE = f"(runs.trigger IN ('user', 'goal') AND NOT {_HAS_CHECKPOINT})"  # never got going
_CHILD = "(runs.parent_run_id IS NOT NULL)"  # goes on when its parent is resumed
_TAKE_OVER_RUNS = f"""
UPDATE runs SET
    state = CASE WHEN {_REQUEUE} THEN 'queued' WHEN {_CHILD} THEN 'timed_out' ELSE state END,
    reason = CASE WHEN {_REQUEUE} THEN reason WHEN {_CHILD} THEN 'interrupted'
                  ELSE 'taken_over' END,
    started_at = CASE WHEN {_REQUEUE} THEN NULL ELSE started_at END,
    ended_at = CASE WHEN {_CHILD} THEN ? ELSE NULL END,
    worker = CASE WHEN {_REQUEUE} THEN NULL ELSE ? END,
    resumable = COALESCE((
        SELECT c.kind <> 'final' FROM checkpoints c WHERE c.run_id = runs.id
        ORDER BY c.seq DESC LIMIT 1
    ), 0)
WHERE state = 'running' AND worker IS ? AND created_at < ?
RETURNING {RUN_COLUMNS}
"""


class SqliteWorkerTables(SqliteRunTables, WorkerTables):
    """`WorkerStore` on SQLite (`SqliteStore` adds the rest)."""

    _worker_sql = SQLITE_WORKERS

    async def claim_queued_run(self, worker_id: str) -> RunRow | None:
        # The oldest eligible queued run is its conversation's oldest: order holds.
        rows = await self._write_now(_CLAIM_QUEUED_RUN, lambda: (time.time(), worker_id))
        return run_row(rows[0]) if rows else None

    async def take_over_runs(
        self,
        dead: str | None,
        worker_id: str,
        *,
        created_before: float = math.inf,
        silent_for: float | None = None,
    ) -> list[RunRow]:
        def take(conn: sqlite3.Connection) -> list[Any]:
            # Under the write lock: the dead worker's row goes (if it is still silent,
            # when that matters), and its runs with it; else nothing is taken.
            now = time.time()
            if dead is not None:
                silent = "" if silent_for is None else " AND beat_at < ?"
                where = (dead,) if silent_for is None else (dead, now - silent_for)
                gone = conn.execute(f"DELETE FROM workers WHERE id = ?{silent}", where)
                if silent_for is not None and gone.rowcount == 0:
                    return []
            params = (now, worker_id, dead, created_before)
            return conn.execute(_TAKE_OVER_RUNS, params).fetchall()

        rows = await self._write_now_with(take, "take over runs")
        return sorted((run_row(r) for r in rows), key=lambda r: r.seq)
