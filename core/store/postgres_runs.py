"""The PostgreSQL tables of runs and jobs: runs, checkpoints, the tool-call idempotency
envelope, the tool process-group ledger (`RunStore`) and fires of scheduled jobs
(`JobStore`). The same statements as `sqlite_runs.py`, in PostgreSQL's dialect."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable
from typing import Any

from core.store.postgres_db import PostgresDatabase, upsert
from core.store.rows import (
    CHECKPOINT_COLUMNS,
    JOB_RUN_COLUMNS,
    RUN_COLUMNS,
    TOOL_CALL_COLUMNS,
    Checkpoint,
    JobRunRecord,
    OwedReply,
    RunRow,
    ToolCallRow,
    checkpoint_row,
    job_run_record,
    run_row,
    tool_call_row,
)

# A run's checkpoints and history are written only while the run is still this worker's
# (none set: one process, always): a worker that was taken for dead and goes on
# afterwards writes nothing over the run its successor took over.
OWNS_RUN = "(%s::text IS NULL OR EXISTS (SELECT 1 FROM runs f WHERE f.id = %s AND f.worker = %s))"
_CHECKPOINT = upsert("checkpoints", CHECKPOINT_COLUMNS, "run_id, seq", where=OWNS_RUN)
_TOOL_STARTED = upsert(
    "tool_calls",
    "run_id, call_id, name, arguments, idempotent, started_at",
    "run_id, call_id",
    reset="completed_at, result, is_error",
)
_TOOL_GROUP = upsert("tool_groups", "pgid, start_ticks, boot_id, worker", "boot_id, pgid")
_FENCE = " AND (%s::text IS NULL OR worker = %s)"  # a run taken over is left alone
_TAKE_HOST_GROUPS = """
DELETE FROM tool_groups g
WHERE substr(g.worker, 1, length(%s)) = %s
  AND NOT EXISTS (
      SELECT 1 FROM workers w
      WHERE w.id = g.worker
        AND w.beat_at >= extract(epoch FROM clock_timestamp())::double precision - %s
  )
RETURNING pgid, start_ticks, boot_id
"""

_NOW = "extract(epoch FROM clock_timestamp())::double precision"
# A fire whose worker is gone — no longer listed, or listed again only since it took the
# fire (it was taken for dead meanwhile) — or a fire of no worker claimed before a time (a
# single process's, before a restart). The times are the server's, as the workers'; a
# fire's `started_at` is when its worker took it.
_TAKE_OVER_FIRES = f"""
UPDATE job_runs SET worker = %s, started_at = {_NOW}
WHERE state = 'running' AND CASE
    WHEN worker IS NULL THEN started_at < %s
    ELSE NOT EXISTS (
        SELECT 1 FROM workers w WHERE w.id = job_runs.worker AND w.started_at <= job_runs.started_at
    )
END
RETURNING {JOB_RUN_COLUMNS}
"""

_CREATE_QUEUED_RUN = """
WITH seen AS (
    INSERT INTO seen_events (channel, event_id, at) VALUES (%s, %s, %s)
    ON CONFLICT (channel, event_id) DO NOTHING RETURNING 1
)
INSERT INTO runs (id, conv, state, trigger, created_at, text)
SELECT %s, %s, 'queued', 'user', %s, %s WHERE EXISTS (SELECT 1 FROM seen)
RETURNING 1
"""


class PostgresRunTables(PostgresDatabase):
    """`RunStore` and `JobStore` on PostgreSQL (`PostgresStore` adds the rest)."""

    _worker_id: str | None = None  # `set_worker`: whose runs and tool groups these are

    def _fence(self) -> tuple[str | None, str | None]:
        return (self._worker_id, self._worker_id)

    # --- runs and checkpoints -------------------------------------------------------

    async def create_run(
        self,
        run_id: str,
        conv: str,
        trigger: str,
        *,
        state: str = "running",
        text: str = "",
        parent_run_id: str | None = None,
        shared: bool = False,
    ) -> None:
        now = time.time()
        queued = state == "queued"
        await self.write(
            "INSERT INTO runs (id, conv, state, trigger, created_at, started_at, text, "
            "parent_run_id, worker) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (run_id, conv, state, trigger, now, None if queued else now, text, parent_run_id,
             None if shared else self._worker_id),
        )  # fmt: skip

    async def create_queued_run(
        self, run_id: str, conv: str, text: str, *, channel: str, event_id: str
    ) -> bool:
        # One statement: a second worker's insert of the same event waits for the first
        # one's commit, then inserts nothing, and so creates no run; it says which.
        now = time.time()
        params = (channel, event_id, now, run_id, conv, now, text)
        return bool(await self._write_now(_CREATE_QUEUED_RUN, params))

    def start_run(self, run_id: str) -> None:
        self.write_soon(
            "UPDATE runs SET state = 'running', started_at = %s WHERE id = %s",
            (time.time(), run_id),
        )

    def resume_run(self, run_id: str) -> None:
        self.write_soon(
            "UPDATE runs SET state = 'running', resumable = FALSE, ended_at = NULL, "
            "worker = COALESCE(%s, worker) WHERE id = %s",
            (self._worker_id, run_id),
        )

    def set_run_state(
        self, run_id: str, state: str, reason: str, *, resumable: bool | None = None
    ) -> None:
        if resumable is None:
            self.write_soon(
                "UPDATE runs SET state = %s, reason = %s, ended_at = %s WHERE id = %s" + _FENCE,
                (state, reason, time.time(), run_id, *self._fence()),
            )
        else:
            self.write_soon(
                "UPDATE runs SET state = %s, reason = %s, ended_at = %s, resumable = %s "
                "WHERE id = %s" + _FENCE,
                (state, reason, time.time(), resumable, run_id, *self._fence()),
            )

    def mark_resumable(self, run_id: str) -> None:
        self.write_soon(
            "UPDATE runs SET resumable = TRUE WHERE id = %s" + _FENCE, (run_id, *self._fence())
        )

    def finish_run(
        self,
        run_id: str,
        *,
        state: str,
        reason: str,
        text: str,
        iterations: int,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        self.write_soon(
            "UPDATE runs SET state = %s, ended_at = %s, reason = %s, text = %s, "
            "iterations = %s, input_tokens = %s, output_tokens = %s WHERE id = %s" + _FENCE,
            (
                state,
                time.time(),
                reason,
                text,
                iterations,
                input_tokens,
                output_tokens,
                run_id,
                *self._fence(),
            ),
        )

    def owe_reply(self, run_id: str, text: str) -> None:
        self.write_soon(
            "UPDATE runs SET reply = %s WHERE id = %s" + _FENCE, (text, run_id, *self._fence())
        )

    async def reply_delivered(self, run_id: str) -> None:
        await self.write("UPDATE runs SET reply = NULL WHERE id = %s", (run_id,))

    async def take_owed_replies(
        self, dead: str | None, worker_id: str | None, *, created_before: float
    ) -> list[OwedReply]:
        rows = await self._write_now(
            "UPDATE runs SET worker = %s WHERE reply IS NOT NULL "
            "AND worker IS NOT DISTINCT FROM %s AND created_at < %s "
            "AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = runs.worker) "
            "RETURNING id, conv, reply",
            (worker_id, dead, created_before),
        )
        return [OwedReply(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def forget_resumable(self, conv: str) -> None:
        self.write_soon("UPDATE runs SET resumable = FALSE WHERE conv = %s AND resumable", (conv,))

    async def run(self, run_id: str) -> RunRow | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = %s", (run_id,))
        return run_row(row) if row else None

    async def child_runs(self, parent_run_id: str) -> list[RunRow]:
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = %s ORDER BY seq",
            (parent_run_id,),
        )
        return [run_row(r) for r in rows]

    async def find_runs(self, prefix: str) -> list[RunRow]:
        # ILIKE: SQLite's LIKE ignores the case of ASCII letters too
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE id ILIKE %s ORDER BY seq DESC",
            (prefix + "%",),
        )
        return [run_row(r) for r in rows]

    async def runs(
        self, *, conv: str | None = None, states: Iterable[str] = (), limit: int = 20
    ) -> list[RunRow]:
        where: list[str] = []
        params: list[Any] = []
        if conv is not None:
            where.append("conv = %s")
            params.append(conv)
        states = list(states)
        if states:
            where.append("state = ANY(%s)")
            params.append(states)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY seq DESC LIMIT %s",
            (*params, limit),
        )
        return [run_row(r) for r in rows]

    def checkpoint(self, cp: Checkpoint) -> None:
        where = (cp.run_id, cp.seq, cp.kind, cp.iteration, cp.cursor, cp.persisted)
        completed = json.dumps(list(cp.completed))
        owner = (self._worker_id, cp.run_id, self._worker_id)
        self.write_soon(_CHECKPOINT, (*where, cp.prompt_hash, completed, cp.at, *owner))

    def _run_owner(self, run_id: str | None) -> tuple[str | None, str | None, str | None]:
        """The parameters of `OWNS_RUN` for `run_id` (None: no fence)."""
        worker = self._worker_id if run_id is not None else None
        return (worker, run_id, worker)

    async def last_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._one(
            f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = %s "
            "ORDER BY seq DESC LIMIT 1",
            (run_id,),
        )
        return checkpoint_row(row) if row else None

    # --- the idempotency envelope ---------------------------------------------------

    def tool_started(
        self, run_id: str, call_id: str, name: str, arguments: str, idempotent: bool
    ) -> None:
        self.write_soon(_TOOL_STARTED, (run_id, call_id, name, arguments, idempotent, time.time()))

    def tool_completed(self, run_id: str, call_id: str, result: str, is_error: bool) -> None:
        self.write_soon(
            "UPDATE tool_calls SET completed_at = %s, result = %s, is_error = %s "
            "WHERE run_id = %s AND call_id = %s",
            (time.time(), result, is_error, run_id, call_id),
        )

    async def tool_calls(self, run_id: str) -> dict[str, ToolCallRow]:
        rows = await self._all(
            f"SELECT {TOOL_CALL_COLUMNS} FROM tool_calls WHERE run_id = %s", (run_id,)
        )
        return {r[0]: tool_call_row(r) for r in rows}

    # --- the tool process-group ledger ------------------------------------------------

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None:
        self.write_soon(_TOOL_GROUP, (pgid, start_ticks, boot_id, self._worker_id))

    def tool_group_ended(self, pgid: int) -> None:
        self.write_soon(
            "DELETE FROM tool_groups WHERE pgid = %s AND worker IS NOT DISTINCT FROM %s",
            (pgid, self._worker_id),
        )

    async def take_tool_groups(
        self, *, host: str | None = None, stale: float = 0.0
    ) -> list[tuple[int, int, str]]:
        """The listed groups (only those of `host`'s silent workers, if given), removed
        from the ledger: only those read (a group listed meanwhile stays)."""
        if host is not None:
            taken = await self._write_now(_TAKE_HOST_GROUPS, (host + ":", host + ":", stale))
            return [(int(r[0]), int(r[1]), str(r[2])) for r in taken]
        rows = await self._all(
            "SELECT pgid, start_ticks, boot_id FROM tool_groups ORDER BY boot_id, pgid"
        )
        if rows:
            await self.write(
                "DELETE FROM tool_groups WHERE (boot_id, pgid) IN "
                "(SELECT * FROM unnest(%s::text[], %s::integer[]))",
                ([r[2] for r in rows], [r[0] for r in rows]),
            )
        return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

    # --- scheduled jobs -----------------------------------------------------------------

    async def job_last_fire(self, job: str) -> float | None:
        row = await self._one("SELECT MAX(fire_time) FROM job_runs WHERE job = %s", (job,))
        return float(row[0]) if row and row[0] is not None else None

    async def claim_job_fire(self, job: str, fire_time: float) -> int | None:
        """Exactly once across workers: the unique (job, fire_time) row is inserted once
        (`ON CONFLICT DO NOTHING`), and won by whoever's claim token it carries."""
        token = f"claim:{uuid.uuid4().hex}"  # replaced by the agent's run id when it ends
        await self.write(
            "INSERT INTO job_runs (job, fire_time, run_id, started_at, state, worker) "
            f"VALUES (%s, %s, %s, {_NOW}, 'running', %s) ON CONFLICT (job, fire_time) DO NOTHING",
            (job, fire_time, token, self._worker_id),
        )
        found = await self._one(
            "SELECT id, run_id FROM job_runs WHERE job = %s AND fire_time = %s", (job, fire_time)
        )
        if found is None or found[1] != token:
            return None
        return int(found[0])

    async def finish_job_run(
        self,
        job_run_id: int,
        *,
        state: str,
        run_id: str | None,
        result: str | None,
        delivered: bool,
        error: str | None,
    ) -> bool:
        rows = await self._write_now(
            "UPDATE job_runs SET ended_at = %s, state = %s, run_id = %s, result = %s, "
            "delivered = %s, error = %s WHERE id = %s AND state = 'running' "
            "AND worker IS NOT DISTINCT FROM %s RETURNING id",
            (time.time(), state, run_id, result, delivered, error, job_run_id, self._worker_id),
        )
        return bool(rows)

    async def take_over_fires(
        self, worker_id: str | None, *, claimed_before: float = -math.inf
    ) -> list[JobRunRecord]:
        rows = await self._write_now(_TAKE_OVER_FIRES, (worker_id, claimed_before))
        return sorted((job_run_record(r) for r in rows), key=lambda r: r["fire_time"])

    async def job_runs(self, job: str, limit: int = 1) -> list[JobRunRecord]:
        rows = await self._all(
            f"SELECT {JOB_RUN_COLUMNS} FROM job_runs WHERE job = %s "
            "ORDER BY fire_time DESC LIMIT %s",
            (job, limit),
        )
        return [job_run_record(r) for r in rows]
