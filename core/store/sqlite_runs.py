"""The SQLite tables of runs and jobs (`RunStore`, `JobStore`): the shared statements of
`run_tables.py`, and what SQLite does its own way — a fire claimed after a read, and the
whole tool-group ledger emptied."""

from __future__ import annotations

import time
import uuid
from typing import Any

from core.store.dialect import SQLITE
from core.store.run_tables import SQLITE_RUNS, RunTables, owns_run
from core.store.sqlite_db import SqliteDatabase

OWNS_RUN = owns_run(SQLITE)  # see `run_tables.owns_run`


class SqliteRunTables(SqliteDatabase, RunTables):
    """`RunStore` and `JobStore` on SQLite (`SqliteStore` adds the rest)."""

    _sql = SQLITE_RUNS

    async def _take_all_tool_groups(self) -> list[Any]:
        rows = await self._all("SELECT pgid, start_ticks, boot_id FROM tool_groups")
        await self.write("DELETE FROM tool_groups")
        return rows

    async def claim_job_fire(self, job: str, fire_time: float) -> int | None:
        """Record a fire before it runs; None if this fire was already claimed (a restart
        must never run the same fire twice). Atomic across tasks and processes: the unique
        (job, fire_time) row is inserted once, and only its inserter gets its id back (a
        read after the write could see the shared reader connection's older snapshot)."""
        if await self._one(  # taken already: no need for the write lock
            "SELECT 1 FROM job_runs WHERE job = ? AND fire_time = ?", (job, fire_time)
        ):
            return None
        token = f"claim:{uuid.uuid4().hex}"  # replaced by the agent's run id when it ends
        rows = await self._write_now(
            "INSERT INTO job_runs (job, fire_time, run_id, started_at, state, worker) "
            "VALUES (?, ?, ?, ?, 'running', ?) ON CONFLICT (job, fire_time) DO NOTHING "
            "RETURNING id",
            lambda: (job, fire_time, token, time.time(), self._worker_id),
        )
        return int(rows[0][0]) if rows else None
