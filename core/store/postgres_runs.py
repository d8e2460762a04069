"""The PostgreSQL tables of runs and jobs (`RunStore`, `JobStore`): the shared statements
of `run_tables.py`, and what PostgreSQL does its own way — a queued run taken in by one
statement, a fire claimed by the token it carries, and the ledger emptied of what was
read."""

from __future__ import annotations

import time
import uuid
from typing import Any

from core.store.dialect import POSTGRES
from core.store.postgres_db import PostgresDatabase
from core.store.run_tables import POSTGRES_RUNS, RunTables, owns_run

OWNS_RUN = owns_run(POSTGRES)  # see `run_tables.owns_run`

_CREATE_QUEUED_RUN = """
WITH seen AS (
    INSERT INTO seen_events (channel, event_id, at) VALUES (%s, %s, %s)
    ON CONFLICT (channel, event_id) DO NOTHING RETURNING 1
)
INSERT INTO runs (id, conv, state, trigger, created_at, text)
SELECT %s, %s, 'queued', 'user', %s, %s WHERE EXISTS (SELECT 1 FROM seen)
RETURNING 1
"""


class PostgresRunTables(PostgresDatabase, RunTables):
    """`RunStore` and `JobStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    _sql = POSTGRES_RUNS

    async def create_queued_run(
        self, run_id: str, conv: str, text: str, *, channel: str, event_id: str
    ) -> bool:
        # One statement: a second worker's insert of the same event waits for the first
        # one's commit, then inserts nothing, and so creates no run; it says which.
        now = time.time()
        params = (channel, event_id, now, run_id, conv, now, text)
        return bool(await self._write_now(_CREATE_QUEUED_RUN, params))

    async def _take_all_tool_groups(self) -> list[Any]:
        # Only those read are removed: a group listed meanwhile stays.
        rows = await self._all(
            "SELECT pgid, start_ticks, boot_id FROM tool_groups ORDER BY boot_id, pgid"
        )
        if rows:
            await self.write(
                "DELETE FROM tool_groups WHERE (boot_id, pgid) IN "
                "(SELECT * FROM unnest(%s::text[], %s::integer[]))",
                ([r[2] for r in rows], [r[0] for r in rows]),
            )
        return rows

    async def claim_job_fire(self, job: str, fire_time: float) -> int | None:
        """Exactly once across workers: the unique (job, fire_time) row is inserted once
        (`ON CONFLICT DO NOTHING`), and won by whoever's claim token it carries."""
        token = f"claim:{uuid.uuid4().hex}"  # replaced by the agent's run id when it ends
        await self.write(
            "INSERT INTO job_runs (job, fire_time, run_id, started_at, state, worker) "
            f"VALUES (%s, %s, %s, {POSTGRES.now}, 'running', %s) "
            "ON CONFLICT (job, fire_time) DO NOTHING",
            (job, fire_time, token, self._worker_id),
        )
        found = await self._one(
            "SELECT id, run_id FROM job_runs WHERE job = %s AND fire_time = %s", (job, fire_time)
        )
        if found is None or found[1] != token:
            return None
        return int(found[0])
