"""What SQLite does its own way in `WorkerStore` (`worker_tables.py` has the rest): a
queued run handed out to the one dispatcher (docs/durability.md#the-queue). SQLite is one
machine's store, so its clock is `time.time()`, read once the write lock is held; the
claim is one statement under that lock. It shares nothing with other workers: heartbeats
and takeover are PostgreSQL's (`SharedStore`)."""

from __future__ import annotations

import time

from core.store.dialect import SQLITE
from core.store.rows import RunRow, run_row
from core.store.sqlite_runs import SqliteRunTables
from core.store.worker_tables import SQLITE_WORKERS, WorkerTables, claim_queued_run, claimable

_CLAIMABLE = claimable(SQLITE)
_CLAIM_QUEUED_RUN = claim_queued_run(SQLITE)


class SqliteWorkerTables(SqliteRunTables, WorkerTables):
    """`WorkerStore` on SQLite (`SqliteStore` adds the rest)."""

    _worker_sql = SQLITE_WORKERS

    async def claim_queued_run(
        self, worker_id: str | None, *, shared: bool = True
    ) -> RunRow | None:
        # Looked for first without the write lock (the reader sees what is committed): a
        # dispatcher woken with nothing to claim never waits for the lock, nor holds it.
        await self.committed()
        if await self._one(_CLAIMABLE, (worker_id, shared)) is None:
            return None
        # One statement under the write lock: the oldest eligible queued run is its
        # conversation's oldest, so order holds.
        rows = await self._write_now(
            _CLAIM_QUEUED_RUN, lambda: (time.time(), worker_id, worker_id, shared)
        )
        return run_row(rows[0]) if rows else None
