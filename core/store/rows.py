"""The rows a `Store` hands back: frozen values, the same for every backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from core.chat import PromptRef


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run (SPEC §7): `queued → running → completed | cancelled | failed | timed_out |
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class ConversationRow:
    """A conversation's session snapshot totals."""

    key: str
    input_tokens: int
    output_tokens: int
    last_compaction: str | None


@dataclass(frozen=True, slots=True)
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
    fire_time: float
    run_id: str | None
    started_at: float
    ended_at: float | None
    state: str
    result: str | None
    delivered: bool
    error: str | None


StoredEvent = tuple[float, str, int | None, dict[str, Any]]
"""One stored event: when, its name, the loop iteration (if any) and its data."""
