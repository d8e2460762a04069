"""The SQLite tables of runs and jobs: runs, checkpoints, the tool-call idempotency
envelope, the tool process-group ledger (`RunStore`) and fires of scheduled jobs
(`JobStore`)."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable

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
from core.store.sqlite_db import SqliteDatabase

_FENCE = " AND (? IS NULL OR worker = ?)"  # a run another worker took over is left alone
# A run's checkpoints and history are written only while the run is still this worker's.
OWNS_RUN = "(? IS NULL OR EXISTS (SELECT 1 FROM runs f WHERE f.id = ? AND f.worker = ?))"
# A fire whose worker is gone (see `postgres_runs._TAKE_OVER_FIRES`).
_TAKE_OVER_FIRES = f"""
UPDATE job_runs SET worker = ?, started_at = ?
WHERE state = 'running' AND CASE
    WHEN worker IS NULL THEN started_at < ?
    ELSE NOT EXISTS (
        SELECT 1 FROM workers w WHERE w.id = job_runs.worker AND w.started_at <= job_runs.started_at
    )
END
RETURNING {JOB_RUN_COLUMNS}
"""
_TAKE_HOST_GROUPS = """
DELETE FROM tool_groups
WHERE substr(worker, 1, length(?)) = ?
  AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = tool_groups.worker AND w.beat_at >= ?)
RETURNING pgid, start_ticks, boot_id
"""


class SqliteRunTables(SqliteDatabase):
    """`RunStore` and `JobStore` on SQLite (`SqliteStore` adds the rest)."""

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
        """A new run, committed (`queued` ones keep the user's message in `text` until
        they start)."""
        now = time.time()
        queued = state == "queued"
        await self.write(
            "INSERT INTO runs (id, conv, state, trigger, created_at, started_at, text, "
            "parent_run_id, worker, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "(SELECT IFNULL(MAX(seq), 0) + 1 FROM runs))",  # under the write lock: in order
            (run_id, conv, state, trigger, now, None if queued else now, text, parent_run_id,
             None if shared else self._worker_id),
        )  # fmt: skip

    async def create_queued_run(
        self, run_id: str, conv: str, text: str, *, channel: str, event_id: str
    ) -> bool:
        """A shared queued run for an event not seen before, both in one transaction (it
        holds the write lock from its start: no other process marks the event between)."""
        self.write_soon(
            "INSERT INTO runs (id, conv, state, trigger, created_at, text) "
            "SELECT ?, ?, 'queued', 'user', ?, ? WHERE NOT EXISTS "
            "(SELECT 1 FROM seen_events WHERE channel = ? AND event_id = ?)",
            (run_id, conv, time.time(), text, channel, event_id),
        )
        await self.write(
            "INSERT OR IGNORE INTO seen_events (channel, event_id, at) VALUES (?, ?, ?)",
            (channel, event_id, time.time()),
        )
        return await self._one("SELECT 1 FROM runs WHERE id = ?", (run_id,)) is not None

    def start_run(self, run_id: str) -> None:
        """A queued run begins."""
        self.write_soon(
            "UPDATE runs SET state = 'running', started_at = ? WHERE id = ?", (time.time(), run_id)
        )

    def resume_run(self, run_id: str) -> None:
        """An interrupted run goes on (`/resume`)."""
        self.write_soon(
            "UPDATE runs SET state = 'running', resumable = 0, ended_at = NULL, "
            "worker = COALESCE(?, worker) WHERE id = ?",
            (self._worker_id, run_id),
        )

    def set_run_state(
        self, run_id: str, state: str, reason: str, *, resumable: bool | None = None
    ) -> None:
        """A run ends (or waits) without an answer of its own: cancelled, failed,
        waiting on a human, interrupted."""
        if resumable is None:
            self.write_soon(
                "UPDATE runs SET state = ?, reason = ?, ended_at = ? WHERE id = ?" + _FENCE,
                (state, reason, time.time(), run_id, *self._fence()),
            )
        else:
            self.write_soon(
                "UPDATE runs SET state = ?, reason = ?, ended_at = ?, resumable = ? WHERE id = ?"
                + _FENCE,
                (state, reason, time.time(), int(resumable), run_id, *self._fence()),
            )

    def mark_resumable(self, run_id: str) -> None:
        self.write_soon(
            "UPDATE runs SET resumable = 1 WHERE id = ?" + _FENCE, (run_id, *self._fence())
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
        """A run's final row: how it ended, its answer and what it used."""
        self.write_soon(
            "UPDATE runs SET state = ?, ended_at = ?, reason = ?, text = ?, iterations = ?, "
            "input_tokens = ?, output_tokens = ? WHERE id = ?" + _FENCE,
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
            "UPDATE runs SET reply = ? WHERE id = ?" + _FENCE, (text, run_id, *self._fence())
        )

    async def reply_delivered(self, run_id: str) -> None:
        await self.write("UPDATE runs SET reply = NULL WHERE id = ?", (run_id,))

    async def take_owed_replies(
        self, dead: str | None, worker_id: str | None, *, created_before: float
    ) -> list[OwedReply]:
        rows = await self._write_now(
            "UPDATE runs SET worker = ? WHERE reply IS NOT NULL AND worker IS ? "
            "AND created_at < ? AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = runs.worker) "
            "RETURNING id, conv, reply",
            lambda: (worker_id, dead, created_before),
        )
        return [OwedReply(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def forget_resumable(self, conv: str) -> None:
        """New input in a conversation supersedes its interrupted runs."""
        self.write_soon("UPDATE runs SET resumable = 0 WHERE conv = ? AND resumable = 1", (conv,))

    async def run(self, run_id: str) -> RunRow | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return run_row(row) if row else None

    async def child_runs(self, parent_run_id: str) -> list[RunRow]:
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY seq",
            (parent_run_id,),
        )
        return [run_row(r) for r in rows]

    async def find_runs(self, prefix: str) -> list[RunRow]:
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE id LIKE ? ORDER BY seq DESC",
            (prefix + "%",),
        )
        return [run_row(r) for r in rows]

    async def runs(
        self, *, conv: str | None = None, states: Iterable[str] = (), limit: int = 20
    ) -> list[RunRow]:
        where, params = [], []
        if conv is not None:
            where.append("conv = ?")
            params.append(conv)
        states = list(states)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY seq DESC LIMIT ?",
            (*params, limit),
        )
        return [run_row(r) for r in rows]

    def checkpoint(self, cp: Checkpoint) -> None:
        self.write_soon(
            "INSERT OR REPLACE INTO checkpoints (run_id, seq, kind, iteration, cursor, "
            f"persisted, prompt_hash, completed, at) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? "
            f"WHERE {OWNS_RUN}",
            (
                cp.run_id,
                cp.seq,
                cp.kind,
                cp.iteration,
                cp.cursor,
                cp.persisted,
                cp.prompt_hash,
                json.dumps(list(cp.completed)),
                cp.at,
                *self._run_owner(cp.run_id),
            ),
        )

    def _run_owner(self, run_id: str | None) -> tuple[str | None, str | None, str | None]:
        """The parameters of `OWNS_RUN` for `run_id` (None: no fence)."""
        worker = self._worker_id if run_id is not None else None
        return (worker, run_id, worker)

    async def last_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._one(
            f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? "
            "ORDER BY seq DESC LIMIT 1",
            (run_id,),
        )
        return checkpoint_row(row) if row else None

    # --- the idempotency envelope ---------------------------------------------------

    def tool_started(
        self, run_id: str, call_id: str, name: str, arguments: str, idempotent: bool
    ) -> None:
        """Queued; flush before running a side-effecting call, so a crash after it shows."""
        self.write_soon(
            "INSERT OR REPLACE INTO tool_calls (run_id, call_id, name, arguments, idempotent, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, call_id, name, arguments, int(idempotent), time.time()),
        )

    def tool_completed(self, run_id: str, call_id: str, result: str, is_error: bool) -> None:
        self.write_soon(
            "UPDATE tool_calls SET completed_at = ?, result = ?, is_error = ? "
            "WHERE run_id = ? AND call_id = ?",
            (time.time(), result, int(is_error), run_id, call_id),
        )

    async def tool_calls(self, run_id: str) -> dict[str, ToolCallRow]:
        rows = await self._all(
            f"SELECT {TOOL_CALL_COLUMNS} FROM tool_calls WHERE run_id = ?", (run_id,)
        )
        return {r[0]: tool_call_row(r) for r in rows}

    # --- the tool process-group ledger ------------------------------------------------

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None:
        """A tool's process group is live (the reaper's ledger; see core/tools/reaper.py)."""
        self.write_soon(
            "INSERT OR REPLACE INTO tool_groups (pgid, start_ticks, boot_id, worker) "
            "VALUES (?, ?, ?, ?)",
            (pgid, start_ticks, boot_id, self._worker_id),
        )

    def tool_group_ended(self, pgid: int) -> None:
        self.write_soon(
            "DELETE FROM tool_groups WHERE pgid = ? AND worker IS ?", (pgid, self._worker_id)
        )

    async def take_tool_groups(
        self, *, host: str | None = None, stale: float = 0.0
    ) -> list[tuple[int, int, str]]:
        """The groups a crashed process left listed (only those of `host`'s silent
        workers, if given), removed from the ledger."""
        if host is None:
            rows = await self._all("SELECT pgid, start_ticks, boot_id FROM tool_groups")
            await self.write("DELETE FROM tool_groups")
        else:
            rows = await self._write_now(
                _TAKE_HOST_GROUPS, lambda: (host + ":", host + ":", time.time() - stale)
            )
        return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

    # --- scheduled jobs -----------------------------------------------------------------

    async def job_last_fire(self, job: str) -> float | None:
        """The latest fire claimed for `job` (runs are never deleted)."""
        row = await self._one("SELECT MAX(fire_time) FROM job_runs WHERE job = ?", (job,))
        return float(row[0]) if row and row[0] is not None else None

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
            "UPDATE job_runs SET ended_at = ?, state = ?, run_id = ?, result = ?, delivered = ?, "
            "error = ? WHERE id = ? AND state = 'running' AND worker IS ? RETURNING id",
            lambda: (
                time.time(),
                state,
                run_id,
                result,
                int(delivered),
                error,
                job_run_id,
                self._worker_id,
            ),
        )
        return bool(rows)

    async def take_over_fires(
        self, worker_id: str | None, *, claimed_before: float = -math.inf
    ) -> list[JobRunRecord]:
        rows = await self._write_now(
            _TAKE_OVER_FIRES, lambda: (worker_id, time.time(), claimed_before)
        )
        return sorted((job_run_record(r) for r in rows), key=lambda r: r["fire_time"])

    async def job_runs(self, job: str, limit: int = 1) -> list[JobRunRecord]:
        rows = await self._all(
            f"SELECT {JOB_RUN_COLUMNS} FROM job_runs WHERE job = ? ORDER BY fire_time DESC LIMIT ?",
            (job, limit),
        )
        return [job_run_record(r) for r in rows]
