"""What PostgreSQL does its own way in `WorkerStore` (`worker_tables.py` has the rest), for
several workers on several machines: a queued run handed out, and a dead worker's runs
taken over.

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
from core.store.rows import RunRow, run_row
from core.store.worker_tables import (
    POSTGRES_WORKERS,
    WorkerTables,
    claim_queued_run,
    take_over_runs,
)

_NOW = POSTGRES.now
_CLAIM_QUEUED_RUN = claim_queued_run(
    POSTGRES,
    also="""
      AND NOT EXISTS (
          SELECT 1 FROM runs e
          WHERE e.conv = q.conv AND e.state = 'queued' AND e.seq < q.seq
      )""",
    lock="\n    FOR UPDATE OF q SKIP LOCKED",
)
# One statement: the dead worker's row goes (only if it is still silent, when told how
# long it must have been), and its runs with it, so a worker that beats again meanwhile
# keeps them, and of workers taking over at once one gets them; the worker finds out it
# was taken for dead by its next heartbeat (`worker_heartbeat`).
_TAKE_OVER_RUNS = f"""
WITH gone AS (
    DELETE FROM workers
    WHERE id = %s AND (%s::double precision IS NULL OR beat_at < {_NOW} - %s)
    RETURNING id
)""" + take_over_runs(
    POSTGRES,
    gone="\n  AND (%s::text IS NULL OR %s::double precision IS NULL"
    " OR EXISTS (SELECT 1 FROM gone))",
)


class PostgresWorkerTables(PostgresRunTables, WorkerTables):
    """`WorkerStore` on PostgreSQL (`PostgresStore` adds the rest)."""

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
