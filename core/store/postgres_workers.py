"""What PostgreSQL does its own way in `WorkerStore` (`worker_tables.py` has the rest), for
several workers on several machines — a queued run handed out — and what only a shared
store does (`SharedStore`): heartbeats, a dead worker's runs taken over, and leases.

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

from core.store.dialect import POSTGRES
from core.store.postgres_runs import PostgresRunTables
from core.store.queue_protocol import WorkerState
from core.store.rows import RUN_COLUMNS, RunRow, run_row
from core.store.worker_tables import POSTGRES_WORKERS, WorkerTables, claim_queued_run

_NOW = POSTGRES.now
_HAS_CHECKPOINT = "EXISTS (SELECT 1 FROM checkpoints c WHERE c.run_id = runs.id)"
# A message, a goal's turn or a trigger's run (docs/triggers.md) that never got going: back
# to the queue, for any worker. (A trigger's post run writes no checkpoint: it is posted
# again, at least once.)
_REQUEUE = f"(runs.trigger IN ('user', 'goal', 'trigger', 'post') AND NOT {_HAS_CHECKPOINT})"
_CHILD = "(runs.parent_run_id IS NOT NULL)"  # goes on when its parent is resumed
_CLAIM_QUEUED_RUN = claim_queued_run(
    POSTGRES,
    also="""
      AND NOT EXISTS (
          SELECT 1 FROM runs e
          WHERE e.conv = q.conv AND e.state = 'queued' AND e.seq < q.seq
      )""",
    lock="\n    FOR UPDATE OF q SKIP LOCKED",
)
# Inserted (False) or beaten again (True): an inserted row starts when it beats (one
# reading of the clock for both).
_HEARTBEAT = (
    "INSERT INTO workers (id, beat_at, started_at) "
    f"SELECT %s, clock.t, clock.t FROM (SELECT {_NOW} AS t) AS clock "
    "ON CONFLICT (id) DO UPDATE SET beat_at = EXCLUDED.beat_at "
    "RETURNING started_at <> beat_at"
)
_TAKE_LEASE = f"""
INSERT INTO leases (name, holder, expires_at) VALUES (%s, %s, {_NOW} + %s)
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE leases.expires_at <= {_NOW} OR leases.holder = EXCLUDED.holder
RETURNING holder
"""
_RENEW_LEASE = (
    f"UPDATE leases SET expires_at = {_NOW} + %s WHERE name = %s AND holder = %s RETURNING holder"
)
_DEAD_WORKERS = f"SELECT id FROM workers WHERE beat_at < {_NOW} - %s ORDER BY beat_at, id"
# The workers and the leases they hold, read at one reading of the server's clock: a
# lease's holder not (or no longer) listed comes too, with no heartbeat.
_WORKER_STATES = f"""
WITH clock AS (SELECT {_NOW} AS t),
held AS (
    SELECT l.holder, l.name, l.expires_at - clock.t AS left_for
    FROM leases l, clock WHERE l.expires_at > clock.t
)
SELECT COALESCE(w.id, held.holder), clock.t - w.beat_at, clock.t - w.started_at,
       held.name, held.left_for
FROM clock CROSS JOIN (workers w FULL OUTER JOIN held ON held.holder = w.id)
ORDER BY w.beat_at DESC NULLS LAST, 1, 4
"""
# One statement: the dead worker's row goes (only if it is still silent, when told how
# long it must have been), and its runs with it, so a worker that beats again meanwhile
# keeps them, and of workers taking over at once one gets them; the worker finds out it
# was taken for dead by its next heartbeat (`worker_heartbeat`).
_TAKE_OVER_RUNS = (
    f"""
WITH gone AS (
    DELETE FROM workers
    WHERE id = %s AND (%s::double precision IS NULL OR beat_at < {_NOW} - %s)
    RETURNING id
)"""
    + f"""
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
)


class PostgresWorkerTables(PostgresRunTables, WorkerTables):
    """`WorkerStore` and `SharedStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    _worker_sql = POSTGRES_WORKERS

    async def claim_queued_run(
        self, worker_id: str | None, *, shared: bool = True
    ) -> RunRow | None:
        rows = await self._write_now(_CLAIM_QUEUED_RUN, (worker_id, worker_id, shared))
        return run_row(rows[0]) if rows else None

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

    async def worker_heartbeat(self, worker_id: str) -> bool:
        rows = await self._write_now(_HEARTBEAT, (worker_id,))
        return bool(rows and rows[0][0])

    async def dead_workers(self, older_than: float) -> list[str]:
        rows = await self._all(_DEAD_WORKERS, (older_than,))
        return [str(r[0]) for r in rows]

    async def worker_states(self) -> list[WorkerState]:
        found: dict[str, tuple[float | None, float | None, list[tuple[str, float]]]] = {}
        for worker, beat_age, up_for, lease, left in await self._all(_WORKER_STATES):
            age = None if beat_age is None else float(beat_age)
            up = None if up_for is None else float(up_for)
            leases = found.setdefault(str(worker), (age, up, []))[2]
            if lease is not None:
                leases.append((str(lease), float(left)))
        return [WorkerState(w, age, up, tuple(ls)) for w, (age, up, ls) in found.items()]

    async def forget_worker(self, worker_id: str) -> None:
        await self.write("DELETE FROM workers WHERE id = %s", (worker_id,))

    async def take_lease(self, name: str, holder: str, ttl: float) -> bool:
        return bool(await self._write_now(_TAKE_LEASE, (name, holder, ttl)))

    async def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        return bool(await self._write_now(_RENEW_LEASE, (ttl, name, holder)))

    async def release_lease(self, name: str, holder: str) -> None:
        await self.write("DELETE FROM leases WHERE name = %s AND holder = %s", (name, holder))
