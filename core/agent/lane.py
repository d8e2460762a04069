"""One conversation's lane (docs/commands.md): its queue, its history and its running run.

`Lane` keeps its own invariants: changes go through its methods (queue, stop, reset,
pin, usage), so the rules — one run at a time, a pinned conversation is never rebuilt,
`/stop` drops the queue — live here once. Commands and the goal driver see the agent
only through `LaneHost`, the few things they need of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, Protocol

from core.agent.conversation import Conversation, ConversationFactory
from core.agent.journal import JournalBox, RunJournal
from core.agent.prefs import ProviderPrefs
from core.chat import ConversationKey, Inbound, Responder
from core.clock import Clock
from core.config import GoalsConfig
from core.eventlog import EventLog
from core.store import GoalRow, RunRow, Store

RunState = Literal[
    "queued", "running", "completed", "cancelled", "failed", "timed_out", "waiting_on_human"
]
TERMINAL_STATES = ("completed", "cancelled", "failed", "timed_out", "waiting_on_human")


@dataclass(frozen=True, slots=True)
class RunReport:
    """How a run ended, for whoever awaited it (a channel, a cron job, a goal, a parent).

    Attributes:
        run_id: the durable run's id.
        state: its final state.
        text: the answer as delivered (or the notice that replaced it).
        stop_reason: why the loop ended (`final`, `max_iterations`, …) or the state when
            the loop never finished (`cancelled`, `failed`).
        failure: what went wrong, in plain words, when `state` is "failed".
    """

    run_id: str
    state: RunState
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    iterations: int = 0
    stop_reason: str = ""
    failure: str | None = None

    @classmethod
    def of_row(cls, row: RunRow) -> RunReport:
        """The report of a run that ended, as the store has it (it ran on another worker)."""
        state: RunState = row.state  # type: ignore[assignment]
        text, reason = row.text or "", row.reason or ""
        return cls(row.id, state, text, row.input_tokens, row.output_tokens, row.iterations, reason)


@dataclass(slots=True)
class Queued:
    """A message waiting for its turn; `done` (if any) receives the run's report."""

    inbound: Inbound
    responder: Responder
    run_id: str
    done: asyncio.Future[RunReport] | None = None

    def settle(self, report: RunReport) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(report)


@dataclass(slots=True)
class Lane:
    """One conversation: its queue, its history and its running run (if any)."""

    key: ConversationKey
    conv_id: str  # the key as one string (see `core.agent.conv_id`)
    journal: JournalBox
    conversation: Conversation | None = None
    provider_name: str = ""
    queue: deque[Queued] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one run at a time
    worker: asyncio.Task[None] | None = None
    run_task: asyncio.Task[RunReport] | None = None
    run_id: str | None = None
    last_state: str | None = None
    responder: Responder | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    goal: GoalRow | None = None
    goal_task: asyncio.Task[None] | None = None
    last_compaction: str | None = None
    generation: int = 0  # of the configuration its conversation was built from
    instructions: str | None = None  # the chat's chosen instruction file it was built with
    stoppable: bool = False  # the run is in its loop; after it, /stop lets it deliver
    pinned: bool = False  # a conversation built by its owner (a cron job): never rebuilt
    users: int = 0  # submits in progress
    # Several workers (`core.agent.workers`): the last run this worker ran here, and
    # whether another worker changed the conversation since (then it is loaded again).
    seen_run: str | None = None
    stale: bool = False

    @property
    def busy(self) -> bool:
        """A run is running."""
        return self.run_task is not None and not self.run_task.done()

    @property
    def working(self) -> bool:
        """A run is running, or the worker is between queued runs."""
        return self.busy or (self.worker is not None and not self.worker.done())

    @property
    def idle(self) -> bool:
        """Nothing running, queued, being taken in or driving a goal: safe to evict."""
        tasks = (self.run_task, self.worker, self.goal_task)
        return not self.users and not self.queue and all(t is None or t.done() for t in tasks)

    def pin(self, conversation: Conversation, provider_name: str) -> None:
        """Use `conversation` (built by the lane's owner, e.g. a cron job) for good."""
        self.conversation, self.provider_name, self.pinned = conversation, provider_name, True

    def adopt(self, conversation: Conversation, provider_name: str, generation: int) -> None:
        """Use a freshly built conversation (not for a pinned lane)."""
        if self.pinned:
            raise RuntimeError(f"lane {self.conv_id} is pinned to its conversation")
        self.conversation, self.provider_name = conversation, provider_name
        self.generation = generation

    def drop_queue(self) -> list[Queued]:
        """Take every waiting message off the queue (`/stop`); returns them."""
        dropped = list(self.queue)
        self.queue.clear()
        return dropped

    async def stop(self) -> bool:
        """Cancel the running run; True if there was one. A run already delivering its
        answer is left to finish."""
        task = self.run_task
        if task is None or task.done():
            return False
        if self.stoppable:
            task.cancel()
        await asyncio.wait({task})  # never raises; our own cancellation still propagates
        return True

    async def stop_goal(self) -> bool:
        """Cancel the goal driver; True if one was running."""
        task = self.goal_task
        if task is None or task.done():
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    def reset(self) -> None:
        """Forget the history and everything derived from it (`/clear`); the provider
        choice stays. The caller holds `lock` and clears the store."""
        if self.conversation is not None:
            self.conversation.messages.clear()
            context = self.conversation.guards.context
            if context is not None:
                context.last_compaction = None
        self.input_tokens = self.output_tokens = 0
        self.last_compaction = None
        self.goal = None
        self.journal.journal = RunJournal()

    def add_usage(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens

    def finished(self, state: str) -> None:
        """The running run ended in `state`."""
        self.last_state, self.run_id = state, None

    def save_snapshot(self, store: Store) -> None:
        store.save_snapshot(
            self.conv_id,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            last_compaction=self.last_compaction,
        )


class LaneHost(Protocol):
    """What commands and the goal driver need of the agent that owns the lanes."""

    store: Store
    events: EventLog
    clock: Clock
    factory: ConversationFactory
    prefs: ProviderPrefs
    goal_settings: GoalsConfig

    @property
    def closing(self) -> bool: ...

    async def conversation_of(self, lane: Lane) -> Conversation: ...

    async def provider_for(self, key: ConversationKey) -> str: ...

    async def chosen_instructions(self, key: ConversationKey) -> str | None: ...

    async def resume(self, lane: Lane, responder: Responder) -> str | None: ...

    async def skip(self, lane: Lane) -> str:
        """`/skip`: drop the lane's interrupted run; what the user is told."""
        ...

    def start_goal(self, lane: Lane, responder: Responder) -> None: ...

    async def run_in_lane(
        self, lane: Lane, responder: Responder, *, user_text: str | None, trigger: str = "user"
    ) -> RunReport | None: ...

    async def status_elsewhere(self, lane: Lane) -> str:
        """What `/status` adds beyond this process (several workers): the run on another
        worker, the messages queued in the store; "" if nothing."""
        ...

    async def stop_elsewhere(self, lane: Lane) -> tuple[int, bool]:
        """`/stop` beyond this process (several workers): how many of the conversation's
        queued runs were dropped, and whether a run on another worker was told to stop."""
        ...


__all__ = ["TERMINAL_STATES", "Lane", "LaneHost", "Queued", "RunReport", "RunState"]
