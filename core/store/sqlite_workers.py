"""`WorkerStore` on SQLite: queued runs handed out, heartbeats and leases. SQLite is one
machine's store, so its clock is `time.time()`, read once a hand-out or lease holds the
write lock; each is one statement under that lock, so processes sharing the file agree."""

from __future__ import annotations

import time

from core.store.rows import RUN_COLUMNS, RunRow, run_row
from core.store.sqlite_runs import SqliteRunTables

_CLAIM_QUEUED_RUN = f"""
UPDATE runs SET state = 'running', started_at = ?, worker = ?
WHERE id = (
    SELECT q.id FROM runs q
    WHERE q.state = 'queued'
      AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.conv = q.conv AND r.state = 'running')
    ORDER BY q.created_at, q.rowid
    LIMIT 1
)
RETURNING {RUN_COLUMNS}
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

    async def worker_heartbeat(self, worker_id: str) -> None:
        now = time.time()
        await self.write(
            "INSERT INTO workers (id, beat_at, started_at) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at",
            (worker_id, now, now),
        )

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
