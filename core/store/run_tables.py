"""The tables of runs and jobs, written once for both backends: runs, checkpoints, the
tool-call idempotency envelope, the tool process-group ledger (`RunStore`) and fires of
scheduled jobs (`JobStore`). Each backend's class (`sqlite_runs.py`, `postgres_runs.py`)
adds its database and what it does its own way: taking in a message, claiming a fire, and
emptying the whole tool-group ledger."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from core.store.dialect import POSTGRES, SQLITE, Dialect
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


def owns_run(d: Dialect) -> str:
    """A run's checkpoints and history are written only while the run is still this
    worker's (none set: one process, always): a worker that was taken for dead and goes on
    afterwards writes nothing over the run its successor took over. Parameters: the
    worker, the run, the worker (`RunTables._run_owner`)."""
    return d.sql(
        f"({d.text_param} IS NULL OR EXISTS (SELECT 1 FROM runs f WHERE f.id = ? AND f.worker = ?))"
    )


class RunSql:
    """The statements of `RunTables` in one dialect, spelt once at import."""

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        fence = f" AND ({d.text_param} IS NULL OR worker = ?)"  # a run taken over is left alone
        seq_column, seq_value = d.sequence("seq", "runs")
        q = d.sql
        self.create_run = q(
            "INSERT INTO runs (id, conv, state, trigger, created_at, started_at, text, "
            f"parent_run_id, worker{seq_column}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?{seq_value})"
        )
        self.start_run = q("UPDATE runs SET state = 'running', started_at = ? WHERE id = ?")
        self.resume_run = q(
            "UPDATE runs SET state = 'running', resumable = FALSE, ended_at = NULL, "
            "worker = COALESCE(?, worker) WHERE id = ?"
        )
        self.set_run_state = q(
            "UPDATE runs SET state = ?, reason = ?, ended_at = ? WHERE id = ?" + fence
        )
        self.set_run_state_resumable = q(
            "UPDATE runs SET state = ?, reason = ?, ended_at = ?, resumable = ? WHERE id = ?"
            + fence
        )
        self.mark_resumable = q("UPDATE runs SET resumable = TRUE WHERE id = ?" + fence)
        self.finish_run = q(
            "UPDATE runs SET state = ?, ended_at = ?, reason = ?, text = ?, iterations = ?, "
            "input_tokens = ?, output_tokens = ? WHERE id = ?" + fence
        )
        self.owe_reply = q("UPDATE runs SET reply = ? WHERE id = ?" + fence)
        self.reply_delivered = q("UPDATE runs SET reply = NULL WHERE id = ?")
        self.take_owed_replies = q(
            f"UPDATE runs SET worker = ? WHERE reply IS NOT NULL AND worker {d.is_} ? "
            "AND created_at < ? AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = runs.worker) "
            "RETURNING id, conv, reply"
        )
        self.forget_resumable = q(
            "UPDATE runs SET resumable = FALSE WHERE conv = ? AND resumable = TRUE"
        )
        self.run = q(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?")
        self.child_runs = q(f"SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY seq")
        # ILIKE on PostgreSQL: SQLite's LIKE ignores the case of ASCII letters too
        self.find_runs = q(f"SELECT {RUN_COLUMNS} FROM runs WHERE id {d.like} ? ORDER BY seq DESC")
        self.checkpoint = d.upsert(
            "checkpoints", CHECKPOINT_COLUMNS, "run_id, seq", where=owns_run(d)
        )
        self.last_checkpoint = q(
            f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE run_id = ? "
            "ORDER BY seq DESC LIMIT 1"
        )
        self.tool_started = d.upsert(
            "tool_calls",
            "run_id, call_id, name, arguments, idempotent, started_at",
            "run_id, call_id",
            reset="completed_at, result, is_error",
        )
        self.tool_completed = q(
            "UPDATE tool_calls SET completed_at = ?, result = ?, is_error = ? "
            "WHERE run_id = ? AND call_id = ?"
        )
        self.tool_calls = q(f"SELECT {TOOL_CALL_COLUMNS} FROM tool_calls WHERE run_id = ?")
        self.tool_group = d.upsert(
            "tool_groups", "pgid, start_ticks, boot_id, worker", "boot_id, pgid"
        )
        self.tool_group_ended = q(f"DELETE FROM tool_groups WHERE pgid = ? AND worker {d.is_} ?")
        self.take_host_groups = q(
            "DELETE FROM tool_groups WHERE substr(worker, 1, length(?)) = ? AND NOT EXISTS "
            "(SELECT 1 FROM workers w WHERE w.id = tool_groups.worker "
            f"AND w.beat_at >= {d.now} - ?) RETURNING pgid, start_ticks, boot_id"
        )
        self.job_last_fire = q("SELECT MAX(fire_time) FROM job_runs WHERE job = ?")
        self.finish_job_run = q(
            "UPDATE job_runs SET ended_at = ?, state = ?, run_id = ?, result = ?, delivered = ?, "
            f"error = ? WHERE id = ? AND state = 'running' AND worker {d.is_} ? RETURNING id"
        )
        # A fire whose worker is gone — no longer listed, or listed again only since it
        # took the fire (it was taken for dead meanwhile) — or a fire of no worker claimed
        # before a time (a single process's, before a restart). A fire's `started_at` is
        # when its worker took it.
        self.take_over_fires = q(
            f"""
UPDATE job_runs SET worker = ?, started_at = {d.now}
WHERE state = 'running' AND CASE
    WHEN worker IS NULL THEN started_at < ?
    ELSE NOT EXISTS (
        SELECT 1 FROM workers w WHERE w.id = job_runs.worker AND w.started_at <= job_runs.started_at
    )
END
RETURNING {JOB_RUN_COLUMNS}
"""
        )
        self.job_runs = q(
            f"SELECT {JOB_RUN_COLUMNS} FROM job_runs WHERE job = ? ORDER BY fire_time DESC LIMIT ?"
        )


SQLITE_RUNS = RunSql(SQLITE)
POSTGRES_RUNS = RunSql(POSTGRES)


class RunTables:
    """`RunStore` and `JobStore` over a database whose statements `_sql` spells (a
    backend's class puts its database first among its bases)."""

    _sql: RunSql
    _worker_id: str | None = None  # `set_worker`: whose runs and tool groups these are

    if TYPE_CHECKING:  # the database's, given by the backend's own base

        async def write(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        def write_soon(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        async def _write_now(self, sql: str, params: Callable[[], Sequence[Any]]) -> list[Any]: ...
        async def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...
        async def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...
        async def flush(self) -> None: ...

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
            self._sql.create_run,
            (run_id, conv, state, trigger, now, None if queued else now, text, parent_run_id,
             None if shared else self._worker_id),
        )  # fmt: skip

    def start_run(self, run_id: str) -> None:
        """A queued run begins."""
        self.write_soon(self._sql.start_run, (time.time(), run_id))

    def resume_run(self, run_id: str) -> None:
        """An interrupted run goes on (`/resume`)."""
        self.write_soon(self._sql.resume_run, (self._worker_id, run_id))

    def set_run_state(
        self, run_id: str, state: str, reason: str, *, resumable: bool | None = None
    ) -> None:
        """A run ends (or waits) without an answer of its own: cancelled, failed,
        waiting on a human, interrupted."""
        if resumable is None:
            self.write_soon(
                self._sql.set_run_state, (state, reason, time.time(), run_id, *self._fence())
            )
        else:
            self.write_soon(
                self._sql.set_run_state_resumable,
                (state, reason, time.time(), resumable, run_id, *self._fence()),
            )

    def mark_resumable(self, run_id: str) -> None:
        self.write_soon(self._sql.mark_resumable, (run_id, *self._fence()))

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
            self._sql.finish_run,
            (state, time.time(), reason, text, iterations, input_tokens, output_tokens, run_id,
             *self._fence()),
        )  # fmt: skip

    def owe_reply(self, run_id: str, text: str) -> None:
        self.write_soon(self._sql.owe_reply, (text, run_id, *self._fence()))

    async def reply_delivered(self, run_id: str) -> None:
        await self.write(self._sql.reply_delivered, (run_id,))

    async def take_owed_replies(
        self, dead: str | None, worker_id: str | None, *, created_before: float
    ) -> list[OwedReply]:
        rows = await self._write_now(
            self._sql.take_owed_replies, lambda: (worker_id, dead, created_before)
        )
        return [OwedReply(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def forget_resumable(self, conv: str) -> None:
        """New input in a conversation supersedes its interrupted runs."""
        self.write_soon(self._sql.forget_resumable, (conv,))

    async def run(self, run_id: str) -> RunRow | None:
        row = await self._one(self._sql.run, (run_id,))
        return run_row(row) if row else None

    async def child_runs(self, parent_run_id: str) -> list[RunRow]:
        return [run_row(r) for r in await self._all(self._sql.child_runs, (parent_run_id,))]

    async def find_runs(self, prefix: str) -> list[RunRow]:
        return [run_row(r) for r in await self._all(self._sql.find_runs, (prefix + "%",))]

    async def runs(
        self, *, conv: str | None = None, states: Iterable[str] = (), limit: int = 20
    ) -> list[RunRow]:
        d = self._sql.dialect
        where: list[str] = []
        params: list[Any] = []
        if conv is not None:
            where.append(f"conv = {d.param}")
            params.append(conv)
        states = list(states)
        if states:
            condition, values = d.in_list("state", states)
            where.append(condition)
            params.extend(values)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._all(
            f"SELECT {RUN_COLUMNS} FROM runs {clause} ORDER BY seq DESC LIMIT {d.param}",
            (*params, limit),
        )
        return [run_row(r) for r in rows]

    def checkpoint(self, cp: Checkpoint) -> None:
        self.write_soon(
            self._sql.checkpoint,
            (cp.run_id, cp.seq, cp.kind, cp.iteration, cp.cursor, cp.persisted, cp.prompt_hash,
             json.dumps(list(cp.completed)), cp.at, *self._run_owner(cp.run_id)),
        )  # fmt: skip

    def _run_owner(self, run_id: str | None) -> tuple[str | None, str | None, str | None]:
        """The parameters of `owns_run` for `run_id` (None: no fence)."""
        worker = self._worker_id if run_id is not None else None
        return (worker, run_id, worker)

    async def last_checkpoint(self, run_id: str) -> Checkpoint | None:
        row = await self._one(self._sql.last_checkpoint, (run_id,))
        return checkpoint_row(row) if row else None

    # --- the idempotency envelope ---------------------------------------------------

    def tool_started(
        self, run_id: str, call_id: str, name: str, arguments: str, idempotent: bool
    ) -> None:
        """Queued; flush before running a side-effecting call, so a crash after it shows."""
        self.write_soon(
            self._sql.tool_started, (run_id, call_id, name, arguments, idempotent, time.time())
        )

    def tool_completed(self, run_id: str, call_id: str, result: str, is_error: bool) -> None:
        self.write_soon(self._sql.tool_completed, (time.time(), result, is_error, run_id, call_id))

    async def tool_calls(self, run_id: str) -> dict[str, ToolCallRow]:
        rows = await self._all(self._sql.tool_calls, (run_id,))
        return {r[0]: tool_call_row(r) for r in rows}

    # --- the tool process-group ledger ------------------------------------------------

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None:
        """A tool's process group is live (the reaper's ledger; see core/sandbox/reaper.py)."""
        self.write_soon(self._sql.tool_group, (pgid, start_ticks, boot_id, self._worker_id))

    def tool_group_ended(self, pgid: int) -> None:
        self.write_soon(self._sql.tool_group_ended, (pgid, self._worker_id))

    async def take_tool_groups(
        self, *, host: str | None = None, stale: float = 0.0
    ) -> list[tuple[int, int, str]]:
        """The groups a crashed process left listed (only those of `host`'s silent
        workers, if given), removed from the ledger."""
        if host is None:
            rows = await self._take_all_tool_groups()
        else:
            clock = self._sql.dialect.clock
            rows = await self._write_now(
                self._sql.take_host_groups, lambda: (host + ":", host + ":", *clock(), stale)
            )
        return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

    async def _take_all_tool_groups(self) -> list[Any]:
        """Every listed group's (pgid, start_ticks, boot_id), removed from the ledger."""
        raise NotImplementedError

    # --- scheduled jobs -----------------------------------------------------------------

    async def job_last_fire(self, job: str) -> float | None:
        """The latest fire claimed for `job` (runs are never deleted)."""
        row = await self._one(self._sql.job_last_fire, (job,))
        return float(row[0]) if row and row[0] is not None else None

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
            self._sql.finish_job_run,
            lambda: (time.time(), state, run_id, result, delivered, error, job_run_id,
                     self._worker_id),
        )  # fmt: skip
        return bool(rows)

    async def take_over_fires(
        self, worker_id: str | None, *, claimed_before: float = -math.inf
    ) -> list[JobRunRecord]:
        clock = self._sql.dialect.clock
        rows = await self._write_now(
            self._sql.take_over_fires, lambda: (worker_id, *clock(), claimed_before)
        )
        return sorted((job_run_record(r) for r in rows), key=lambda r: r["fire_time"])

    async def job_runs(self, job: str, limit: int = 1) -> list[JobRunRecord]:
        rows = await self._all(self._sql.job_runs, (job, limit))
        return [job_run_record(r) for r in rows]
