"""Durable runs (docs/durability.md): checkpoints, the idempotency envelope, resume and reconcile.

`RunRecorder` is told of every safe boundary of a run by the loop and wraps every tool call
(it is the executor's `Envelope`). The functions decide whether an interrupted run can go
on, and turn the runs a crash left `running` into `timed_out` ones at start-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableSequence
from typing import TYPE_CHECKING

from core.chat import ConversationKey, Inbound
from core.errors import StoreError
from core.eventlog import EventLog
from core.fence import HELD, Fence
from core.loop_tools import unanswered_calls
from core.messages import Message, ToolCall
from core.store import Checkpoint, RunRow, Store, ToolCallRow

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from core.agent.conversation import Conversation

INTERRUPTED_RESULT = (
    "interrupted by a restart: this call may or may not have taken effect; it was not run again"
)
NOT_HELD_RESULT = (
    "not run: this worker could not make sure it still holds this run (another worker may "
    "have taken it over)"
)


class RunRecorder:
    """Checkpoints and the idempotency envelope of one run."""

    def __init__(
        self,
        store: Store,
        conv: str,
        run_id: str,
        prompt_hash: str,
        *,
        replayable: set[str] | None = None,
        fence: Fence = HELD,
    ) -> None:
        self.store, self.conv, self.run_id = store, conv, run_id
        self.fence = fence  # a side-effecting call runs only while the run is this worker's
        self.prompt_hash = prompt_hash
        # The calls left open by the interruption a resumed run goes on from: only these
        # may be replayed (ids can repeat across iterations with some providers).
        self.replayable = set(replayable or ())
        self.seq = 0
        self.iteration = 0
        self.cursor = 0  # where this run's messages start
        self.completed: list[str] = []
        self.persisted: list[Message] = []
        self.store_wait = 5.0  # seconds a side-effecting call waits to be sure of the run

    def persist(self, messages: list[Message]) -> None:
        """Save the messages that changed since the last save: appends, the system message
        rebuilt each turn, or a rewrite by compaction. Messages are immutable, so a changed
        one is a different object."""
        old = self.persisted
        changed = [i for i, m in enumerate(messages) if i >= len(old) or old[i] is not m]
        if changed or len(old) != len(messages):
            shrunk = len(messages) < len(old)
            self.store.save_messages(
                self.conv, messages, changed, shrunk=shrunk, run_id=self.run_id
            )
        self.persisted = list(messages)

    def checkpoint(self, kind: str, iteration: int, messages: list[Message]) -> None:
        self.iteration = max(self.iteration, iteration)
        self.persist(messages)
        self.seq += 1
        self.store.checkpoint(
            Checkpoint(
                self.run_id,
                self.seq,
                kind,
                self.iteration,
                self.cursor,
                len(messages),
                self.prompt_hash,
                tuple(self.completed),
                time.time(),
            )
        )

    async def replay(self, call: ToolCall) -> Message | None:
        """The stored result of `call` if it is one the interruption left open and it had
        completed (the same call, not just the same id); each open call is checked once."""
        if call.id not in self.replayable:
            return None
        self.replayable.discard(call.id)
        stored = (await self.store.tool_calls(self.run_id)).get(call.id)
        if stored is None or not stored.completed:
            return None
        if (stored.name, stored.arguments) != (call.name, call.arguments):
            return None
        return Message.tool_result(call, stored.result or "", is_error=stored.is_error)

    async def begin(self, call: ToolCall, idempotent: bool) -> Message | None:
        """Record the start; a completed call is replayed instead. Only a side-effecting
        call waits for the commit before it runs: after a crash, an idempotent call that
        left no trace is simply run again, which is what resume does with it anyway."""
        if (stored := await self.replay(call)) is not None:
            return stored
        if not idempotent and not await self.fence.holds(self.store_wait):
            # Another worker took the run over (this one was silent too long), or the
            # store cannot say: the call is not run here.
            return Message.tool_result(call, NOT_HELD_RESULT, is_error=True)
        self.store.tool_started(self.run_id, call.id, call.name, call.arguments, idempotent)
        if not idempotent:
            await self.store.flush()
        return None

    async def end(self, call: ToolCall, result: Message) -> None:
        """Queued with the next commit: a crash before it makes the call look unfinished,
        and resume then errs on the safe side (asks, for a side-effecting call)."""
        self.store.tool_completed(self.run_id, call.id, result.content, result.is_error)
        self.completed.append(call.id)


def close_unanswered(
    messages: MutableSequence[Message], pending: list[ToolCall], rows: Mapping[str, ToolCallRow]
) -> None:
    """Give every unanswered call a result (its stored one, else "interrupted"), so the
    transcript stays valid without running anything."""
    for call in pending:
        row = rows.get(call.id)
        if row is not None and row.completed and row.result is not None:
            messages.append(Message.tool_result(call, row.result, is_error=row.is_error))
        else:
            messages.append(Message.tool_result(call, INTERRUPTED_RESULT, is_error=True))


def reopen_calls(messages: MutableSequence[Message], call_ids: set[str]) -> bool:
    """Take the placeholder results ("cancelled" by a shutdown) of calls `call_ids` of the
    last assistant message out of the transcript, so that a resumed run runs them (they
    were still waiting on an approver: they had run nothing). True if any was taken out."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    keep = [
        m
        for m in messages[last + 1 :]
        if not (m.role == "tool" and m.tool_call_id in call_ids and m.is_error)
    ]
    if last < 0 or len(keep) == len(messages) - last - 1:
        return False
    messages[last + 1 :] = keep
    return True


async def reopen_resumable(store: Store, run_id: str, conversation: Conversation) -> bool:
    """A shutdown closed a resumable tool's call (`delegate`) with "cancelled" before it
    completed: take that result out, so that the resumed run runs the call again and the
    tool picks up from its own record (its child runs). True if any was taken out."""
    registry = conversation.executor.registry
    open_ids = {
        call_id
        for call_id, row in (await store.tool_calls(run_id)).items()
        if not row.completed and (tool := registry.get(row.name)) is not None and tool.resumable
    }
    return bool(open_ids) and reopen_calls(conversation.messages, open_ids)


async def resume_risk(
    store: Store, run_id: str, conversation: Conversation, *, same_prompt: bool = True
) -> str | None:
    """Why run `run_id` must not simply go on, or None; changes nothing. A side-effecting
    call that started but never finished makes it unsafe, whether the transcript left it
    open (a crash) or gave it a "cancelled" result (a shutdown): running it again could
    repeat its effect. With `same_prompt`, so does a changed system prompt or tool set
    (a restart with another configuration); a run another worker takes over goes on with
    that worker's, as its conversation's next turn would."""
    checkpoint = await store.last_checkpoint(run_id)
    if checkpoint is None:
        return "it stopped before its first checkpoint"
    if same_prompt and checkpoint.prompt_hash != conversation.prompt_hash():
        return "the configuration or the tools changed since it was interrupted"
    half = _half(await store.tool_calls(run_id))
    if not half:
        return None
    names = ", ".join(f"`{name}`" for name in sorted({row.name for row in half.values()}))
    return f"{names} had started but not finished, and running it again could repeat its effect"


async def resume_blocker(store: Store, run_id: str, conversation: Conversation) -> str | None:
    """`resume_risk`; when it is a call that started but never finished, such calls get
    the result "interrupted" in the transcript (so the run can go on without them, if a
    person says so: `close_half_calls`)."""
    why = await resume_risk(store, run_id, conversation)
    if why is not None and _half(await store.tool_calls(run_id)):
        await close_half_calls(store, run_id, conversation)
    return why


async def close_half_calls(store: Store, run_id: str, conversation: Conversation) -> None:
    """Give each side-effecting call of run `run_id` that started but never finished the
    result "interrupted" in the transcript (it is not run again), and every other
    unanswered call its stored result (or "interrupted")."""
    rows = await store.tool_calls(run_id)
    half = _half(rows)
    messages = conversation.messages
    for index, message in enumerate(messages):
        if message.role == "tool" and message.tool_call_id in half:
            messages[index] = Message(  # a new message: token counts are cached per message
                role="tool",
                content=INTERRUPTED_RESULT,
                tool_call_id=message.tool_call_id,
                name=message.name,
                is_error=True,
            )
    close_unanswered(messages, unanswered_calls(messages), rows)


def _half(rows: Mapping[str, ToolCallRow]) -> dict[str, ToolCallRow]:
    """The side-effecting calls that started and never finished, by call id."""
    return {cid: row for cid, row in rows.items() if not row.completed and not row.idempotent}


async def reconcile_runs(store: Store, events: EventLog, *, before: float) -> list[RunRow]:
    """Runs created before `before` (by an earlier process) and left `running` by a crash
    become `timed_out`; returns those with a checkpoint to go on from (marked resumable).
    A run claimed but never begun (no checkpoint: it posted nothing) is queued again, as
    a worker that takes over does (`core.agent.recovery.take_over`)."""
    interrupted: list[RunRow] = []
    for run in await store.runs(states=["running"], limit=10_000):
        if run.created_at >= before:  # this process's own live run
            continue
        checkpoint = await store.last_checkpoint(run.id)
        if checkpoint is None and run.parent_run_id is None:
            await store.unclaim_run(run.id)
            events.emit("agent_run.requeued", {}, run_id=run.id, conv=run.conv)
            continue
        resumable = checkpoint is not None and checkpoint.kind != "final"
        store.set_run_state(run.id, "timed_out", "interrupted", resumable=resumable)
        events.emit("agent_run.reconcile", {"resumable": resumable}, run_id=run.id, conv=run.conv)
        if resumable:
            interrupted.append(run)
    return interrupted


async def sender_of(store: Store, row: RunRow, key: ConversationKey) -> Inbound | None:
    """The message of queued run `row` that another worker took in, as far as the store
    keeps its sender (docs/governance.md#roles); None if unknown (the run then has the
    default role)."""
    try:
        sender = await store.sender(row.id)
    except StoreError:
        log.warning("run %s: its sender is not readable", row.id, exc_info=True)
        return None
    if sender is None:
        return None
    user_id, user_name, groups = sender
    text = row.text or ""
    return Inbound(*key, user_id=user_id, user_name=user_name, text=text, groups=groups)
