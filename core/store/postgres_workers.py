"""`WorkerStore` on PostgreSQL: queued runs handed out, heartbeats and leases, for several
workers on several machines.

A queued run is handed out with `FOR UPDATE SKIP LOCKED`, so workers claiming at once never
wait on each other nor take the same run; a run is eligible only if it is its
conversation's oldest queued run and nothing of that conversation is running, so a second
worker that skips the first one's locked run cannot take the next run of the same
conversation. "Oldest" is by `seq`, which the server's sequence gives each run as it is
stored; hand-outs, heartbeats and leases read the server's clock when they take effect:
the workers' clocks may differ.
"""

from __future__ import annotations

import math

from core.store.postgres_runs import PostgresRunTables
from core.store.rows import RUN_COLUMNS, RunRow, run_row

_NOW = "extract(epoch FROM clock_timestamp())::double precision"

_CLAIM_QUEUED_RUN = f"""
UPDATE runs SET state = 'running', started_at = {_NOW}, worker = %s
WHERE id = (
    SELECT q.id FROM runs q
    WHERE q.state = 'queued' AND q.worker IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM runs r
          WHERE r.conv = q.conv
            AND (r.state = 'running' OR r.reply IS NOT NULL
                 OR (r.state = 'waiting_on_human' AND r.resumable))
      )
      AND NOT EXISTS (
          SELECT 1 FROM runs e
          WHERE e.conv = q.conv AND e.state = 'queued' AND e.seq < q.seq
      )
    ORDER BY q.seq
    LIMIT 1
    FOR UPDATE OF q SKIP LOCKED
)
RETURNING {RUN_COLUMNS}
"""
_HAS_CHECKPOINT = "EXISTS (SELECT 1 FROM checkpoints c WHERE c.run_id = runs.id)"
# A message (or a goal's turn) that never got going: back to the queue, for any worker.
_REQUEUE = f"(runs.trigger IN ('user', 'goal') AND NOT {_HAS_CHECKPOINT})"
_CHILD = "(runs.parent_run_id IS NOT NULL)"  # goes on when its parent is resumed
# One statement: the dead worker's row goes (only if it is still silent, when told how
# long it must have been), and its runs with it, so a worker that beats again meanwhile
# keeps them, and of workers taking over at once one gets them; the worker finds out it
# was taken for dead by its next heartbeat (`worker_heartbeat`).
_TAKE_OVER_RUNS = f"""
WITH gone AS (
    DELETE FROM workers
    WHERE id = %s AND (%s::double precision IS NULL OR beat_at < {_NOW} - %s)
    RETURNING id
)
UPDATE runs SET
    state = CASE WHEN {_REQUEUE} THEN 'queued' WHEN {_CHILD} THEN 'timed_out' ELSE state END,
    reason = CASE WHEN {_REQUEUE} THEN reason WHEN {_CHILD} THEN 'interrupted'
                  ELSE 'taken_over' END,
    started_at = CASE WHEN {_REQUEUE} THEN NULL ELSE started_at END,
    ended_at = CASE WHEN {_CHILD} THEN {_NOW} ELSE NULL END,
    worker = CASE WHEN {_REQUEUE} THEN NULL ELSE %s END,
    resumable = COALESCE((
        SELECT c.kind <> 'final' FROM checkpoints c WHERE c.run_id = runs.id
        ORDER BY c.seq DESC LIMIT 1
    ), FALSE)
WHERE state = 'running' AND worker IS NOT DISTINCT FROM %s AND created_at < %s
  AND (%s::text IS NULL OR %s::double precision IS NULL OR EXISTS (SELECT 1 FROM gone))
RETURNING {RUN_COLUMNS}
"""
# A paused run (interrupted, unsafe to go on by itself) holds its conversation's queue:
# `/resume` takes it although messages wait behind it. Any other interrupted run waits
# until nothing of its conversation is queued.
_TAKE_RESUMABLE = """
UPDATE runs SET state = 'running', resumable = FALSE, ended_at = NULL, worker = %s
WHERE id = %s AND resumable AND state NOT IN ('running', 'queued')
  AND NOT EXISTS (
      SELECT 1 FROM runs o WHERE o.conv = runs.conv
        AND (o.state = 'running' OR (o.state = 'queued' AND runs.state <> 'waiting_on_human'))
  )
RETURNING id
"""
# Inserted (False) or beaten again (True): an inserted row starts when it beats.
_HEARTBEAT = f"""
WITH now AS (SELECT {_NOW} AS t)
INSERT INTO workers (id, beat_at, started_at) SELECT %s, t, t FROM now
ON CONFLICT (id) DO UPDATE SET beat_at = EXCLUDED.beat_at
RETURNING started_at <> beat_at
"""
_TAKE_LEASE = f"""
INSERT INTO leases (name, holder, expires_at) VALUES (%s, %s, {_NOW} + %s)
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE leases.expires_at <= {_NOW} OR leases.holder = EXCLUDED.holder
RETURNING holder
"""


class PostgresWorkerTables(PostgresRunTables):
    """`WorkerStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    async def claim_queued_run(self, worker_id: str) -> RunRow | None:
        rows = await self._write_now(_CLAIM_QUEUED_RUN, (worker_id,))
        return run_row(rows[0]) if rows else None

    def set_worker(self, worker_id: str | None) -> None:
        self._worker_id = worker_id

    async def unclaim_run(self, run_id: str) -> None:
        await self.write(
            "UPDATE runs SET state = 'queued', started_at = NULL, worker = NULL "
            "WHERE id = %s AND state = 'running'",
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
        params = (dead, silent_for, silent_for, worker_id, dead, created_before, dead, silent_for)
        rows = await self._write_now(_TAKE_OVER_RUNS, params)
        return sorted((run_row(r) for r in rows), key=lambda r: r.seq)

    async def take_resumable_run(self, run_id: str, worker_id: str | None) -> bool:
        return bool(await self._write_now(_TAKE_RESUMABLE, (worker_id, run_id)))

    async def cancel_queued(
        self, conv: str, reason: str, *, run_id: str | None = None
    ) -> list[str]:
        rows = await self._write_now(
            f"UPDATE runs SET state = 'cancelled', reason = %s, ended_at = {_NOW} "
            "WHERE conv = %s AND state = 'queued' AND (%s::text IS NULL OR id = %s) "
            "RETURNING id, seq",
            (reason, conv, run_id, run_id),
        )
        return [str(r[0]) for r in sorted(rows, key=lambda r: int(r[1]))]

    async def worker_heartbeat(self, worker_id: str) -> bool:
        rows = await self._write_now(_HEARTBEAT, (worker_id,))
        return bool(rows and rows[0][0])

    async def dead_workers(self, older_than: float) -> list[str]:
        rows = await self._all(
            f"SELECT id FROM workers WHERE beat_at < {_NOW} - %s ORDER BY beat_at, id",
            (older_than,),
        )
        return [str(r[0]) for r in rows]

    async def forget_worker(self, worker_id: str) -> None:
        await self.write("DELETE FROM workers WHERE id = %s", (worker_id,))

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool:
        return bool(await self._write_now(_TAKE_LEASE, (name, holder, ttl)))

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        rows = await self._write_now(
            f"UPDATE leases SET expires_at = {_NOW} + %s WHERE name = %s AND holder = %s "
            "RETURNING holder",
            (ttl, name, holder),
        )
        return bool(rows)

    async def release_lease(self, name: str, holder: str) -> None:
        await self.write("DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder))
