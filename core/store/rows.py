"""The rows a `Store` hands back: frozen values, the same for every backend, and how each
is built from the columns every backend selects."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypedDict

from core.chat import PromptRef
from core.records import record


@record(frozen=True, slots=True)
class RunRow:
    """One run (docs/durability.md): `queued → running → completed | cancelled | failed | timed_out
    |
    waiting_on_human`, what it answered and what it used."""

    id: str
    conv: str
    state: str
    trigger: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    reason: str | None
    text: str | None
    iterations: int
    input_tokens: int
    output_tokens: int
    resumable: bool
    error: str | None
    worker: str | None = None  # the worker that claimed it (`claim_queued_run`)
    parent_run_id: str | None = None  # the run that delegated it (a child run)
    seq: int = 0  # the store's order of runs: when it was stored, whatever the clocks


@record(frozen=True, slots=True)
class OwedReply:
    """A run's answer its conversation has not been shown yet (`Store.owe_reply`)."""

    run_id: str
    conv: str
    text: str


@record(frozen=True, slots=True)
class Checkpoint:
    """A run's state at a safe boundary; the one with the highest `seq` is the last."""

    run_id: str
    seq: int
    kind: str
    iteration: int
    cursor: int
    persisted: int
    prompt_hash: str
    completed: tuple[str, ...]
    at: float


@record(frozen=True, slots=True)
class ToolCallRow:
    """One tool call in a run's idempotency envelope."""

    call_id: str
    name: str
    arguments: str
    idempotent: bool
    started_at: float
    completed_at: float | None
    result: str | None
    is_error: bool

    @property
    def completed(self) -> bool:
        return self.completed_at is not None


@record(frozen=True, slots=True)
class ApprovalRow:
    """One approval request. `pending` until the run that asked takes the decision; an
    approver's `answer` can arrive before that (a click just after a restart)."""

    id: str
    conv: str
    run_id: str | None
    call_id: str | None
    tool: str
    summary: str
    reason: str
    state: str  # pending | approved | denied | cancelled | expired
    requested_at: float
    deadline: float | None
    prompt: PromptRef | None
    answer: str | None  # approved | denied, while still pending
    answered_by: str | None


@record(frozen=True, slots=True)
class ConversationRow:
    """A conversation's session snapshot totals."""

    key: str
    input_tokens: int
    output_tokens: int
    last_compaction: str | None


@record(frozen=True, slots=True)
class GoalRow:
    """A conversation's goal (`/goal`)."""

    conv: str
    text: str
    state: str
    auto: bool
    max_turns: int
    turns: int
    note: str | None


class JobRunRecord(TypedDict):
    """One claimed fire of a scheduled job (a dict, so callers read it by key)."""

    id: int
    job: str
    fire_time: float
    run_id: str | None
    started_at: float
    ended_at: float | None
    state: str
    result: str | None
    delivered: bool
    error: str | None
    worker: str | None  # whose the fire is while it runs: its claimer's, or its taker's


StoredEvent = tuple[float, str, int | None, dict[str, Any]]
"""One stored event: when, its name, the loop iteration (if any) and its data."""


# --- from a database row to a value: every backend selects these columns in this order ---

RUN_COLUMNS = (
    "id, conv, state, trigger, created_at, started_at, ended_at, reason, text, iterations, "
    "input_tokens, output_tokens, resumable, error, worker, parent_run_id, seq"
)
CHECKPOINT_COLUMNS = "run_id, seq, kind, iteration, cursor, persisted, prompt_hash, completed, at"
TOOL_CALL_COLUMNS = (
    "call_id, name, arguments, idempotent, started_at, completed_at, result, is_error"
)
GOAL_COLUMNS = "conv, text, state, auto, max_turns, turns, note"
APPROVAL_COLUMNS = (
    "id, conv, run_id, call_id, tool, summary, reason, state, requested_at, deadline, prompt, "
    "answer, answered_by"
)
JOB_RUN_COLUMNS = (
    "id, job, fire_time, run_id, started_at, ended_at, state, result, delivered, error, worker"
)

Values = Sequence[Any]


def run_row(row: Values) -> RunRow:
    """A `RUN_COLUMNS` row (flags may be stored as 0/1)."""
    values = list(row)
    values[12] = bool(values[12])
    return RunRow(*values)


def checkpoint_row(row: Values) -> Checkpoint:
    """A `CHECKPOINT_COLUMNS` row; `completed` is stored as a JSON list."""
    run, seq, kind, iteration, cursor, persisted, prompt_hash, completed, at = row
    done = tuple(json.loads(completed))
    return Checkpoint(run, seq, kind, iteration, cursor, persisted, prompt_hash, done, at)


def tool_call_row(row: Values) -> ToolCallRow:
    """A `TOOL_CALL_COLUMNS` row."""
    r = row
    return ToolCallRow(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6], bool(r[7]))


def goal_row(row: Values) -> GoalRow:
    """A `GOAL_COLUMNS` row."""
    return GoalRow(row[0], row[1], row[2], bool(row[3]), row[4], row[5], row[6])


def approval_row(row: Values) -> ApprovalRow:
    """An `APPROVAL_COLUMNS` row; `prompt` is stored as a JSON list."""
    values = list(row)
    if values[10] is not None:
        values[10] = PromptRef(*json.loads(values[10]))
    return ApprovalRow(*values)


def job_run_record(row: Values) -> JobRunRecord:
    """A `JOB_RUN_COLUMNS` row."""
    id_, job, fire_time, run_id, started_at, ended_at, state, result, delivered, error, worker = row
    return JobRunRecord(
        id=id_,
        job=job,
        fire_time=fire_time,
        run_id=run_id,
        started_at=started_at,
        ended_at=ended_at,
        state=state,
        result=result,
        delivered=bool(delivered),
        error=error,
        worker=worker,
    )
