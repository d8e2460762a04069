"""`WorkerStore` written once for both backends: runs given back or cancelled while
queued, and `/resume` taking a paused run. Each backend's class
(`sqlite_workers.py`, `postgres_workers.py`) adds the hand-out of a queued run, which it
does its own way; PostgreSQL's adds what only a shared store does (`SharedStore`). Times
are the dialect's clock, read when a statement takes effect (the server's, on PostgreSQL:
workers' clocks may differ)."""

from __future__ import annotations

from core.store.dialect import POSTGRES, SQLITE, Dialect
from core.store.rows import RUN_COLUMNS
from core.store.run_tables import RunTables


def claimable(d: Dialect, *, also: str = "", lock: str = "") -> str:
    """The id of the oldest eligible queued run (parameters: the worker, whether runs of
    no worker count): `also` narrows which runs are eligible, `lock` ends it (PostgreSQL's
    `FOR UPDATE SKIP LOCKED`)."""
    return d.sql(f"""
    SELECT q.id FROM runs q
    WHERE q.state = 'queued' AND (q.worker {d.is_} {d.text_param} OR (? AND q.worker IS NULL))
      AND NOT EXISTS (
          SELECT 1 FROM runs r
          WHERE r.conv = q.conv
            AND (r.state = 'running' OR r.reply IS NOT NULL
                 OR (r.state = 'waiting_on_human' AND r.resumable))
      ){also}
    ORDER BY q.seq
    LIMIT 1{lock}""")


def claim_queued_run(d: Dialect, *, also: str = "", lock: str = "") -> str:
    """The hand-out of the oldest eligible queued run (`claimable`), for a backend's
    `claim_queued_run` (parameters: `now`'s, the worker, then `claimable`'s)."""
    return d.sql(f"""
UPDATE runs SET state = 'running', started_at = {d.now}, worker = ?
WHERE id = ({claimable(d, also=also, lock=lock)}
)
RETURNING {RUN_COLUMNS}
""")


class WorkerSql:
    """The statements of `WorkerTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        q = d.sql
        self.unclaim_run = q(
            "UPDATE runs SET state = 'queued', started_at = NULL, worker = NULL "
            "WHERE id = ? AND state = 'running'"
        )
        # A paused run (interrupted, unsafe to go on by itself) holds its conversation's
        # queue: `/resume` takes it although messages wait behind it. Any other
        # interrupted run waits until nothing of its conversation is queued.
        self.take_resumable = q(
            """
UPDATE runs SET state = 'running', resumable = FALSE, ended_at = NULL, worker = ?
WHERE id = ? AND resumable AND state NOT IN ('running', 'queued')
  AND NOT EXISTS (
      SELECT 1 FROM runs o WHERE o.conv = runs.conv
        AND (o.state = 'running' OR (o.state = 'queued' AND runs.state <> 'waiting_on_human'
                                     AND o.created_at >= ?))
  )
RETURNING id
"""
        )
        self.cancel_queued = q(
            f"UPDATE runs SET state = 'cancelled', reason = ?, ended_at = {d.now} "
            f"WHERE conv = ? AND state = 'queued' AND ({d.text_param} IS NULL OR id = ?) "
            "RETURNING id, seq"
        )


SQLITE_WORKERS = WorkerSql(SQLITE)
POSTGRES_WORKERS = WorkerSql(POSTGRES)


class WorkerTables(RunTables):
    """`WorkerStore` over a database whose statements `_worker_sql` spells (but for the
    hand-out, which each backend's class adds)."""

    _worker_sql: WorkerSql

    def set_worker(self, worker_id: str | None) -> None:
        self._worker_id = worker_id

    async def unclaim_run(self, run_id: str) -> None:
        await self.write(self._worker_sql.unclaim_run, (run_id,))

    async def take_resumable_run(
        self, run_id: str, worker_id: str | None, *, since: float = 0.0
    ) -> bool:
        rows = await self._write_now(
            self._worker_sql.take_resumable, lambda: (worker_id, run_id, since)
        )
        return bool(rows)

    async def cancel_queued(
        self, conv: str, reason: str, *, run_id: str | None = None
    ) -> list[str]:
        clock = self._worker_sql.dialect.clock
        rows = await self._write_now(
            self._worker_sql.cancel_queued, lambda: (reason, *clock(), conv, run_id, run_id)
        )
        return [str(r[0]) for r in sorted(rows, key=lambda r: int(r[1]))]
