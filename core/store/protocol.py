"""The store seam: what core needs from durable state, split by concern (docs/durability.md,
docs/scale-out.md).

Every backend keeps the same promises; `tests/store/test_conformance.py` holds them to it.

Writes come in two kinds:
    - `async` writes return once the write is committed (durable).
    - plain (non-async) writes are queued for the next group commit and return at once.
      They commit in the order they were queued, and are durable once a later `flush()`
      or `async` write of the same store returns. A queued write that fails is raised as
      `StoreError` by the next `flush()` of the task that owns it (see `Store.write_for`).

Reads see what is committed: flush first to read what was just queued.

Text is kept as given, except that a NUL character may come back as U+FFFD (PostgreSQL's
text cannot hold one). Several stores may be open on the same data at once (workers,
`parley runs`): opening migrates it once, and a job's fire is claimed by one of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, Self

from core.chat import PromptRef
from core.messages import Message
from core.store import writes
from core.store.memory_rows import MemoryRow, Scope
from core.store.people_protocol import AuditStore as AuditStore
from core.store.people_protocol import GrantStore as GrantStore
from core.store.people_protocol import RunSenderStore as RunSenderStore
from core.store.queue_protocol import SharedStore as SharedStore
from core.store.queue_protocol import WorkerStore as WorkerStore
from core.store.rows import (
    ApprovalRow,
    Checkpoint,
    ConversationRow,
    GoalRow,
    JobRunRecord,
    OwedReply,
    RunRow,
    StoredEvent,
    ToolCallRow,
)
from core.store.trigger_rows import TriggerStore as TriggerStore
from core.store.usage_rows import UsageStore


class RunStore(Protocol):
    """Runs, their checkpoints, the tool-call idempotency envelope and the ledger of live
    tool process groups."""

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
        """A new run, committed. A `queued` run keeps the user's message in `text` and has
        no `started_at` until `start_run`; a child run names the run that delegated it. The
        run is this store's worker's (`set_worker`), unless it is `shared`: a queued run any
        worker may claim."""
        ...

    def start_run(self, run_id: str) -> None:
        """Queued: a queued run begins (`running`, `started_at` now)."""
        ...

    def resume_run(self, run_id: str) -> None:
        """Queued: an interrupted run goes on (`/resume`): `running`, no longer resumable,
        no `ended_at`."""
        ...

    def set_run_state(
        self, run_id: str, state: str, reason: str, *, resumable: bool | None = None
    ) -> None:
        """Queued: a run ends (or waits) without an answer of its own — cancelled, failed,
        waiting on a human, interrupted. `ended_at` is now; `resumable` changes only if
        given. With a worker set (`set_worker`), only a run still that worker's changes (a
        run another worker took over is left alone)."""
        ...

    def mark_resumable(self, run_id: str) -> None:
        """Queued: the run may be taken up again by `/resume`. With a worker set, only a
        run still that worker's changes."""
        ...

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
        """Queued: a run's final row — how it ended, its answer and what it used. With a
        worker set (`set_worker`), only a run still that worker's changes."""
        ...

    def owe_reply(self, run_id: str, text: str) -> None:
        """Queued with the run's final row: its answer is owed to its conversation until
        `reply_delivered`; a crash meanwhile leaves it to recovery (`take_owed_replies`).
        With a worker set, only a run still that worker's."""
        ...

    async def reply_delivered(self, run_id: str) -> None:
        """Committed: the platform took the run's answer (or refused it for good)."""
        ...

    async def take_owed_replies(
        self, dead: str | None, worker_id: str | None, *, created_before: float
    ) -> list[OwedReply]:
        """Committed: the answers owed by runs of worker `dead` (None: of no worker)
        created before `created_before`, now `worker_id`'s to post — only while `dead` is
        not listed (`worker_heartbeat`: a worker taken over, or never listed); each goes
        to one taker."""
        ...

    def forget_resumable(self, conv: str) -> None:
        """Queued: new input in `conv` supersedes its interrupted runs (none stays
        resumable)."""
        ...

    async def run(self, run_id: str) -> RunRow | None:
        """The run `run_id`, or None."""
        ...

    async def child_runs(self, parent_run_id: str) -> list[RunRow]:
        """The runs `parent_run_id` delegated (`parent_run_id` set), oldest first."""
        ...

    async def find_runs(self, prefix: str) -> list[RunRow]:
        """Runs whose id starts with `prefix`, newest first."""
        ...

    async def runs(
        self, *, conv: str | None = None, states: Iterable[str] = (), limit: int = 20
    ) -> list[RunRow]:
        """At most `limit` runs, the last stored first (`seq`); only `conv`'s and only in
        `states` if given."""
        ...

    def checkpoint(self, cp: Checkpoint) -> None:
        """Queued: a checkpoint; one with the same (run, seq) is replaced. With a worker
        set (`set_worker`), only while the run is still that worker's."""
        ...

    async def last_checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's checkpoint with the highest `seq`, or None."""
        ...

    def tool_started(
        self, run_id: str, call_id: str, name: str, arguments: str, idempotent: bool
    ) -> None:
        """Queued: a tool call begins (a call with the same ids starts over). Flush before
        running a side-effecting call, so that a crash after it shows."""
        ...

    def tool_completed(self, run_id: str, call_id: str, result: str, is_error: bool) -> None:
        """Queued: a started tool call ended with `result`."""
        ...

    async def tool_calls(self, run_id: str) -> dict[str, ToolCallRow]:
        """The run's tool calls by call id."""
        ...

    def tool_group_started(self, pgid: int, start_ticks: int, boot_id: str) -> None:
        """Queued: a tool's process group is live (the reaper's ledger; see
        core/sandbox/reaper.py), recorded as this store's worker's (`set_worker`)."""
        ...

    def tool_group_ended(self, pgid: int) -> None:
        """Queued: this store's worker's process group is gone."""
        ...

    async def take_tool_groups(
        self, *, host: str | None = None, stale: float = 0.0
    ) -> list[tuple[int, int, str]]:
        """The groups (pgid, start ticks, boot id) a crashed process left listed, removed
        from the ledger. With `host`: only the groups of workers on `host` (ids
        `host:…`) that have not beaten in the last `stale` seconds or are not listed at
        all; the groups of live workers, and of other machines, stay."""
        ...


class MessageStore(Protocol):
    """Conversation histories and their session snapshots."""

    async def load_messages(self, conv: str) -> list[Message]:
        """`conv`'s history, in order (empty if none)."""
        ...

    def save_messages(
        self,
        conv: str,
        messages: Sequence[Message],
        changed: Iterable[int] | None = None,
        *,
        shrunk: bool = True,
        run_id: str | None = None,
    ) -> None:
        """Queued: persist the positions `changed` (default: all) of `messages`; if the list
        may have `shrunk`, drop stored messages past its end. Written by run `run_id`
        (with a worker set, `set_worker`): only while that run is still the worker's, so
        a worker taken for dead writes nothing over the history its successor goes on
        with."""
        ...

    async def conversation(self, conv: str) -> ConversationRow | None:
        """`conv`'s snapshot totals, or None."""
        ...

    def save_snapshot(
        self, conv: str, *, input_tokens: int, output_tokens: int, last_compaction: str | None
    ) -> None:
        """Queued: the session snapshot's totals (the messages are saved as they grow)."""
        ...

    async def clear_conversation(self, conv: str) -> None:
        """`/clear`, committed: history, totals, journal and goal go, and no run of `conv`
        stays resumable; provider preference and runs stay."""
        ...


class JournalStore(Protocol):
    """The run journal, one per conversation."""

    async def journal(self, conv: str) -> dict[str, Any] | None:
        """`conv`'s journal, or None."""
        ...

    def save_journal(self, conv: str, body: dict[str, Any]) -> None:
        """Queued: `conv`'s journal becomes `body` (JSON values)."""
        ...


class PreferenceStore(Protocol):
    """What a conversation or channel chose: its provider, instructions and goal."""

    async def provider_pref(self, channel: str, channel_id: str) -> str | None:
        """The provider chosen in a channel, or None."""
        ...

    async def set_provider_pref(self, channel: str, channel_id: str, provider: str) -> None:
        """Committed: the provider chosen in a channel (the last choice stands)."""
        ...

    async def instruction_pref(self, channel: str, channel_id: str) -> str | None:
        """The instruction file chosen for a channel (`/instructions set`), or None."""
        ...

    async def set_instruction_pref(self, channel: str, channel_id: str, name: str | None) -> None:
        """Committed: the instruction file chosen for a channel; None forgets the choice."""
        ...

    async def goal(self, conv: str) -> GoalRow | None:
        """`conv`'s goal, or None."""
        ...

    async def save_goal(self, goal: GoalRow | None, conv: str) -> None:
        """Committed: `conv`'s goal becomes `goal` (its own `conv` is not used); None
        clears it."""
        ...


class DedupeStore(Protocol):
    """Platform event ids taken in before, so that a redelivery starts nothing."""

    async def seen(self, channel: str, event_id: str) -> bool:
        """Whether the event was marked seen (a redelivery)."""
        ...

    def mark_seen_soon(self, channel: str, event_id: str) -> None:
        """Queued: mark the event seen (commit it with what the event produced). Marking
        it again changes nothing."""
        ...

    async def mark_seen(self, channel: str, event_id: str) -> None:
        """Mark the event seen and flush (so also everything queued before)."""
        ...


class ApprovalStore(Protocol):
    """Approval requests, which survive a restart (docs/tools.md#approvals)."""

    async def request_approval(self, row: ApprovalRow) -> None:
        """Committed: a new `pending` request (before its prompt is posted); `row.state`,
        `prompt` and `answer` are not used."""
        ...

    def approval_posted(self, approval_id: str, prompt: PromptRef) -> None:
        """Queued: where the request's prompt is."""
        ...

    async def answer_approval(self, approval_id: str, answer: str, by: str) -> None:
        """Committed: an approver's answer to a pending request that no run is waiting on
        yet; the first answer stands, and a request no longer pending takes none."""
        ...

    def approval_resolved(self, approval_id: str, state: str) -> None:
        """Queued: the request is decided (`approved`, `denied`, `cancelled`, …)."""
        ...

    async def approval(self, approval_id: str) -> ApprovalRow | None:
        """The request `approval_id`, or None."""
        ...

    async def pending_approval(self, run_id: str, call_id: str) -> ApprovalRow | None:
        """The latest pending request of tool call `call_id` of run `run_id`, or None."""
        ...

    async def pending_approvals(self, *, before: float) -> list[ApprovalRow]:
        """Requests asked before `before` (by an earlier process) and still pending,
        oldest first."""
        ...

    def expire_approvals(self, approval_ids: Iterable[str]) -> None:
        """Queued: those of the requests still pending become `expired` (their runs will
        not go on)."""
        ...


class EventStore(Protocol):
    """Structured events (docs/operations.md)."""

    def add_event(
        self,
        name: str,
        data: dict[str, Any],
        *,
        run_id: str | None,
        conv: str | None,
        iteration: int | None,
        at: float,
    ) -> None:
        """Queued: one event (`data` values that are not JSON are stored as strings)."""
        ...

    async def events(self, run_id: str) -> list[StoredEvent]:
        """The run's events in the order they were added."""
        ...


class JobStore(Protocol):
    """Fires of scheduled jobs: each fire runs once, across restarts and workers."""

    async def job_last_fire(self, job: str) -> float | None:
        """The latest fire time claimed for `job`, or None."""
        ...

    async def claim_job_fire(self, job: str, fire_time: float) -> int | None:
        """Committed: claim a fire before it runs; its job-run id, or None if the fire was
        already claimed (by this or any other task or process). The fire is this store's
        worker's (`set_worker`) while it runs, and its `started_at` (when its worker took
        it) is the store's clock."""
        ...

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
        """Committed: how a claimed fire ended — only while it is running and this store's
        worker's (a fire taken over is its taker's to finish); whether it was."""
        ...

    async def take_over_fires(
        self, worker_id: str | None, *, claimed_before: float = -math.inf
    ) -> list[JobRunRecord]:
        """Committed: the fires still running whose worker is gone — no longer listed
        (`worker_heartbeat`), or listed again only since the fire was claimed (it was
        taken for dead meanwhile) — and the running fires of no worker claimed before
        `claimed_before` (a single process's, before a restart) become `worker_id`'s
        (`started_at` now: when it took them); returns them, oldest fire first. Of takers
        at once, each fire goes to one."""
        ...

    async def job_runs(self, job: str, limit: int = 1) -> list[JobRunRecord]:
        """At most `limit` of `job`'s fires, latest fire time first."""
        ...


class MemoryStore(Protocol):
    """Long-term memories (docs/delegation-memory.md), each in one scope. Every read and delete is
    limited
    to the scopes it is given: which ones a person may see is the caller's to decide."""

    async def remember(self, scope: Scope, text: str, *, made_by: str, conv: str) -> MemoryRow:
        """Committed: a new memory in `scope`, made by user `made_by` in conversation
        `conv`; the stored row (its id is new, never one a forgotten memory had)."""
        ...

    async def recall(self, query: str, scopes: Sequence[Scope], limit: int = 5) -> list[MemoryRow]:
        """At most `limit` memories of `scopes` that share a word (after stemming; stop
        words do not count) with `query`, the most relevant first, each with its `score`
        (0..1, higher is more relevant; scales differ between backends)."""
        ...

    async def memories(self, scopes: Sequence[Scope], limit: int = 50) -> list[MemoryRow]:
        """At most `limit` memories of `scopes`, newest first."""
        ...

    async def forget_memory(self, memory_id: int, scopes: Sequence[Scope]) -> bool:
        """Committed: memory `memory_id` is deleted if it is in one of `scopes`; whether
        it was."""
        ...

    async def forget_memories(self, scope: Scope) -> int:
        """Committed: every memory of `scope` is deleted; how many."""
        ...


class Store(
    RunStore,
    MessageStore,
    JournalStore,
    PreferenceStore,
    DedupeStore,
    ApprovalStore,
    GrantStore,
    AuditStore,
    RunSenderStore,
    EventStore,
    JobStore,
    WorkerStore,
    MemoryStore,
    UsageStore,
    TriggerStore,
    Protocol,
):
    """All of Parley's durable state. Open one with `core.store.open_store`; close it with
    `aclose()` or use it as an async context manager."""

    async def flush(self) -> None:
        """Wait until everything queued so far is committed.

        Raises:
            StoreError: a write this task's owner (see `write_for`) queued before this call
                failed, and no `flush` has reported it yet (each failure is raised once).
        """
        ...

    def describe(self) -> str:
        """What was opened, for a person: the SQLite file, or PostgreSQL's host, port and
        database (and schema); never a password."""
        ...

    async def committed(self) -> None:
        """Wait until everything queued so far is committed, as `flush` does, but raise no
        failure (it stays for its owner's `flush`): for a caller that must not post
        before the queued writes are durable, yet is not the one to report them."""
        ...

    async def aclose(self) -> None:
        """Commit what is queued, then release the store (also when that commit fails)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None:
        """`aclose()`."""
        ...

    @staticmethod
    def write_for(owner: str) -> None:
        """Tag the current task's writes as `owner`'s (a conversation), so that a failed
        one is raised by that owner's `flush`, not by another conversation's."""
        writes.write_for(owner)
