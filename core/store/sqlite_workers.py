"""What SQLite does its own way in `WorkerStore` (`worker_tables.py` has the rest): a
queued run handed out, and a dead worker's runs taken over. SQLite is one machine's store,
so its clock is `time.time()`, read once the write lock is held; each is one transaction
under that lock, so processes sharing the file agree."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

from core.store.dialect import SQLITE
from core.store.rows import RunRow, run_row
from core.store.sqlite_runs import SqliteRunTables
from core.store.worker_tables import SQLITE_WORKERS, WorkerTables, claim_queued_run, take_over_runs

_CLAIM_QUEUED_RUN = claim_queued_run(SQLITE)
_TAKE_OVER_RUNS = take_over_runs(SQLITE)


class SqliteWorkerTables(SqliteRunTables, WorkerTables):
    """`WorkerStore` on SQLite (`SqliteStore` adds the rest)."""

    _worker_sql = SQLITE_WORKERS

    async def claim_queued_run(
        self, worker_id: str | None, *, shared: bool = True
    ) -> RunRow | None:
        # One statement under the write lock: the oldest eligible queued run is its
        # conversation's oldest, so order holds.
        rows = await self._write_now(
            _CLAIM_QUEUED_RUN, lambda: (time.time(), worker_id, worker_id, shared)
        )
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
