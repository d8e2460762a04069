"""`WorkerStore` on SQLite: queued runs handed out, heartbeats and leases. SQLite is one
machine's store, so its clock is `time.time()`, read once a hand-out or lease holds the
write lock; each is one statement under that lock, so processes sharing the file agree."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

from core.store.rows import RUN_COLUMNS, RunRow, run_row
from core.store.sqlite_runs import SqliteRunTables

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
_TAKE_RESUMABLE = """
UPDATE runs SET state = 'running', resumable = 0, ended_at = NULL, worker = ?
WHERE id = ? AND resumable AND state NOT IN ('running', 'queued')
  AND NOT EXISTS (
      SELECT 1 FROM runs o WHERE o.conv = runs.conv
        AND (o.state = 'running' OR (o.state = 'queued' AND runs.state <> 'waiting_on_human'))
  )
RETURNING id
"""
_TAKE_LEASE = """
INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leases.expires_at <= ? OR leases.holder = excluded.holder
RETURNING holder
"""


class SqliteWorkerTables(SqliteRunTables):
    """`WorkerStore` on SQLite (`SqliteStore` adds the rest)."""

    async def claim_queued_run(self, worker_id: str) -> RunRow | None:
        # The oldest eligible queued run is its conversation's oldest: order holds.
        rows = await self._write_now(_CLAIM_QUEUED_RUN, lambda: (time.time(), worker_id))
        return run_row(rows[0]) if rows else None

    def set_worker(self, worker_id: str | None) -> None:
        self._worker_id = worker_id

    async def unclaim_run(self, run_id: str) -> None:
        await self.write(
            "UPDATE runs SET state = 'queued', started_at = NULL, worker = NULL "
            "WHERE id = ? AND state = 'running'",
            (run_id,),
        )

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

    async def take_resumable_run(self, run_id: str, worker_id: str | None) -> bool:
        return bool(await self._write_now(_TAKE_RESUMABLE, lambda: (worker_id, run_id)))

    async def cancel_queued(
        self, conv: str, reason: str, *, run_id: str | None = None
    ) -> list[str]:
        rows = await self._write_now(
            "UPDATE runs SET state = 'cancelled', reason = ?, ended_at = ? "
            "WHERE conv = ? AND state = 'queued' AND (? IS NULL OR id = ?) RETURNING id, seq",
            lambda: (reason, time.time(), conv, run_id, run_id),
        )
        return [str(r[0]) for r in sorted(rows, key=lambda r: int(r[1]))]

    async def worker_heartbeat(self, worker_id: str) -> bool:
        def params() -> tuple[str, float, float]:
            now = time.time()
            return (worker_id, now, now)

        rows = await self._write_now(
            "INSERT INTO workers (id, beat_at, started_at) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at "
            "RETURNING started_at <> beat_at",  # an inserted row starts when it beats
            params,
        )
        return bool(rows and rows[0][0])

    async def dead_workers(self, older_than: float) -> list[str]:
        rows = await self._all(
            "SELECT id FROM workers WHERE beat_at < ? ORDER BY beat_at, id",
            (time.time() - older_than,),
        )
        return [str(r[0]) for r in rows]

    async def forget_worker(self, worker_id: str) -> None:
        await self.write("DELETE FROM workers WHERE id = ?", (worker_id,))

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool:
        def params() -> tuple[str, str, float, float]:
            now = time.time()
            return (name, holder, now + ttl, now)

        return bool(await self._write_now(_TAKE_LEASE, params))

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        rows = await self._write_now(
            "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? RETURNING holder",
            lambda: (time.time() + ttl, name, holder),
        )
        return bool(rows)

    async def release_lease(self, name: str, holder: str) -> None:
        await self.write("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))
