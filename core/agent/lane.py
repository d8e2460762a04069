"""One conversation's lane (docs/commands.md): its history and its running run.

`Lane` keeps its own invariants: its fields are private and change only through its
verbs (begin and end a run, adopt or pin a conversation, restore, reset, set the goal,
stop), so the rules — one run at a time, a pinned conversation is never rebuilt — live
here once. Its messages wait in the store's queue, not here (`core.agent.dispatcher`).
Commands and the goal driver see the agent only through `LaneHost`, the few things they
need of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Literal, Protocol

from core.agent.conversation import Conversation, ConversationFactory
from core.agent.journal import EMPTY_JOURNAL, JournalBox, RunJournal
from core.agent.prefs import ProviderPrefs
from core.audit import AuditLog
from core.chat import ConversationKey, Responder
from core.clock import Clock
from core.config import GoalsConfig
from core.cost.meter import Ledger
from core.eventlog import EventLog
from core.records import record
from core.roles import Roles
from core.store import ConversationRow, GoalRow, RunRow, Store

RunState = Literal[
    "queued", "running", "completed", "cancelled", "failed", "timed_out", "waiting_on_human"
]
TERMINAL_STATES = ("completed", "cancelled", "failed", "timed_out", "waiting_on_human")


@record(frozen=True, slots=True)
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


class Lane:
    """One conversation: its history and its running run (if any).

    Its state is private; the agent, the commands, the goal driver and the dispatcher
    change it only through the verbs below, and read it through properties.
    """

    __slots__ = (
        "_conv_id",
        "_conversation",
        "_generation",
        "_goal",
        "_goal_task",
        "_input_tokens",
        "_instructions",
        "_journal",
        "_key",
        "_last_compaction",
        "_last_state",
        "_lock",
        "_output_tokens",
        "_pinned",
        "_provider_name",
        "_responder",
        "_run_id",
        "_run_task",
        "_seen_run",
        "_stale",
        "_stoppable",
        "_users",
        "_worker",
    )

    def __init__(self, key: ConversationKey, conv_id: str, journal: JournalBox) -> None:
        self._key = key
        self._conv_id = conv_id  # the key as one string (see `core.agent.conv_id`)
        self._journal = journal
        self._conversation: Conversation | None = None
        self._provider_name = ""
        self._lock = asyncio.Lock()  # one run at a time
        self._worker: asyncio.Task[None] | None = None
        self._run_task: asyncio.Task[RunReport] | None = None
        self._run_id: str | None = None
        self._last_state: str | None = None
        self._responder: Responder | None = None
        self._input_tokens = 0
        self._output_tokens = 0
        self._goal: GoalRow | None = None
        self._goal_task: asyncio.Task[None] | None = None
        self._last_compaction: str | None = None
        self._generation = 0  # of the configuration its conversation was built from
        self._instructions: str | None = None  # the chat's instruction file it was built with
        self._stoppable = False  # the run is in its loop; after it, /stop lets it deliver
        self._pinned = False  # a conversation built by its owner (a cron job): never rebuilt
        self._users = 0  # submits in progress
        # Several workers (`core.agent.workers`): the last run this worker ran here, and
        # whether another worker changed the conversation since (then it is loaded again).
        self._seen_run: str | None = None
        self._stale = False

    # --- what others read ---------------------------------------------------------------

    @property
    def key(self) -> ConversationKey:
        return self._key

    @property
    def conv_id(self) -> str:
        """The key as one string (see `core.agent.conv_id`)."""
        return self._conv_id

    @property
    def journal(self) -> JournalBox:
        return self._journal

    @property
    def lock(self) -> asyncio.Lock:
        """Held by the run (one at a time) and by whatever changes the history."""
        return self._lock

    @property
    def conversation(self) -> Conversation | None:
        return self._conversation

    @property
    def provider_name(self) -> str:
        return self._provider_name

    @property
    def generation(self) -> int:
        """Of the configuration the conversation was built from."""
        return self._generation

    @property
    def instructions(self) -> str | None:
        """The chat's chosen instruction file the conversation was built with."""
        return self._instructions

    @property
    def pinned(self) -> bool:
        """The conversation was built by the lane's owner (a cron job): never rebuilt."""
        return self._pinned

    @property
    def worker(self) -> asyncio.Task[None] | None:
        """The task that runs the lane's claimed (or resumed) run."""
        return self._worker

    @property
    def run_task(self) -> asyncio.Task[RunReport] | None:
        return self._run_task

    @property
    def run_id(self) -> str | None:
        """The running run's id, while its loop runs."""
        return self._run_id

    @property
    def last_state(self) -> str | None:
        """How the last run here ended."""
        return self._last_state

    @property
    def stoppable(self) -> bool:
        """The run is in its loop; after it, `/stop` lets it deliver."""
        return self._stoppable

    @property
    def responder(self) -> Responder | None:
        """Where the lane's latest message came from: where it answers."""
        return self._responder

    @property
    def input_tokens(self) -> int:
        return self._input_tokens

    @property
    def output_tokens(self) -> int:
        return self._output_tokens

    @property
    def last_compaction(self) -> str | None:
        return self._last_compaction

    @property
    def goal(self) -> GoalRow | None:
        return self._goal

    @property
    def goal_task(self) -> asyncio.Task[None] | None:
        return self._goal_task

    @property
    def seen_run(self) -> str | None:
        """Several workers: the last run this worker ran here."""
        return self._seen_run

    @property
    def stale(self) -> bool:
        """Several workers: another worker changed the conversation since it was loaded."""
        return self._stale

    @property
    def busy(self) -> bool:
        """A run is running."""
        return self._run_task is not None and not self._run_task.done()

    @property
    def working(self) -> bool:
        """A run is running, or the task of a claimed (or resumed) run is getting it going."""
        return self.busy or (self._worker is not None and not self._worker.done())

    @property
    def idle(self) -> bool:
        """Nothing running, being taken in or driving a goal: safe to evict (what is
        queued is in the store)."""
        tasks = (self._run_task, self._worker, self._goal_task)
        return not self._users and all(t is None or t.done() for t in tasks)

    # --- who uses it and who answers ------------------------------------------------------

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """While a message is taken in or a claimed run gets going: never evicted."""
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1

    def answer_to(self, responder: Responder) -> None:
        """The lane's latest message came from `responder`: its runs answer there."""
        self._responder = responder

    def work(self, task: asyncio.Task[None] | None, responder: Responder | None = None) -> None:
        """`task` runs the lane's work now (a claimed or a resumed run)."""
        self._worker = task
        if task is not None:  # a done task is let go: an idle lane holds no finished run
            task.add_done_callback(self._worker_done)
        if responder is not None:
            self._responder = responder

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if self._worker is task:
            self._worker = None

    # --- the conversation --------------------------------------------------------------------

    def pin(self, conversation: Conversation, provider_name: str) -> None:
        """Use `conversation` (built by the lane's owner, e.g. a cron job) for good."""
        self._conversation, self._provider_name, self._pinned = conversation, provider_name, True

    def adopt(
        self,
        conversation: Conversation,
        provider_name: str,
        generation: int,
        instructions: str | None = None,
    ) -> None:
        """Use a freshly built conversation (not for a pinned lane)."""
        if self._pinned:
            raise RuntimeError(f"lane {self._conv_id} is pinned to its conversation")
        self._conversation, self._provider_name = conversation, provider_name
        self._generation, self._instructions = generation, instructions

    def built_with(self, provider_name: str, generation: int, instructions: str | None) -> bool:
        """The conversation was built for this provider, configuration and instructions."""
        return (self._provider_name, self._generation, self._instructions) == (
            provider_name,
            generation,
            instructions,
        )

    def restore(
        self,
        row: ConversationRow | None,
        goal: GoalRow | None,
        journal: RunJournal | None = None,
    ) -> None:
        """Take the totals, the goal (and the journal, if given) the store has."""
        if journal is not None:
            self._journal.journal = journal
        self._input_tokens = row.input_tokens if row else 0
        self._output_tokens = row.output_tokens if row else 0
        self._last_compaction = row.last_compaction if row else None
        self._goal = goal

    def reset(self) -> None:
        """Forget the history and everything derived from it (`/clear`); the provider
        choice stays. The caller holds `lock` and clears the store."""
        if self._conversation is not None:
            self._conversation.messages.clear()
            context = self._conversation.guards.context
            if context is not None:
                context.last_compaction = None
        self._input_tokens = self._output_tokens = 0
        self._last_compaction = None
        self._goal = None
        self._journal.journal = EMPTY_JOURNAL

    def mark_stale(self) -> None:
        """Several workers: another worker changed the conversation; load it again."""
        self._stale = True

    def loaded(self) -> None:
        """Several workers: the conversation is as the store has it now."""
        self._stale = False

    def saw_run(self, run_id: str | None) -> None:
        """Several workers: `run_id` is the last run this worker knows of here."""
        self._seen_run = run_id

    # --- runs ------------------------------------------------------------------------------

    def run_as(self, task: asyncio.Task[RunReport]) -> None:
        """`task` is the lane's run (`/stop` cancels it alone)."""
        self._run_task = task
        task.add_done_callback(self._run_done)

    def _run_done(self, task: asyncio.Task[RunReport]) -> None:
        if self._run_task is task:
            self._run_task = None

    def begin_run(self, run_id: str) -> None:
        """Run `run_id` entered its loop: `/stop` cuts it short."""
        self._run_id, self._stoppable = run_id, True

    def delivering(self) -> None:
        """The run's loop ended: from here on its answer is delivered, not cut short."""
        self._stoppable = False

    def end_run(self, state: str) -> None:
        """The running run ended in `state`."""
        self._last_state, self._run_id = state, None

    def settled(self, state: str) -> None:
        """The lane's last run now stands in `state` (e.g. a resume found unsafe)."""
        self._last_state = state

    def add_usage(self, input_tokens: int, output_tokens: int) -> None:
        self._input_tokens += input_tokens
        self._output_tokens += output_tokens

    def compacted(self, before: int, after: int, kind: str) -> None:
        """The history was compacted from `before` to `after` tokens (`kind` says how)."""
        self._last_compaction = f"{before}→{after} ({kind})"

    def save_snapshot(self, store: Store) -> None:
        store.save_snapshot(
            self._conv_id,
            input_tokens=self._input_tokens,
            output_tokens=self._output_tokens,
            last_compaction=self._last_compaction,
        )

    # --- goals -------------------------------------------------------------------------------

    def set_goal(self, goal: GoalRow | None) -> None:
        """The conversation's goal is now `goal` (None: no goal). The caller saves it."""
        self._goal = goal

    def drive_goal(self, task: asyncio.Task[None]) -> None:
        """`task` drives the goal without user input (one per lane)."""
        self._goal_task = task

    async def stop(self) -> bool:
        """Cancel the running run; True if there was one. A run already delivering its
        answer is left to finish."""
        task = self._run_task
        if task is None or task.done():
            return False
        if self._stoppable:
            task.cancel()
        await asyncio.wait({task})  # never raises; our own cancellation still propagates
        return True

    async def stop_goal(self) -> bool:
        """Cancel the goal driver; True if one was running."""
        task = self._goal_task
        if task is None or task.done():
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True


class LaneQueue(Protocol):
    """The store's queue as commands see it (`core.agent.dispatcher.Dispatcher`)."""

    async def waiting(self, lane: Lane) -> tuple[bool, int]:
        """Whether a run of the lane's conversation is claimed, and how many are queued."""
        ...

    async def status(self, lane: Lane) -> str:
        """What `/status` says beyond this process; "" if nothing."""
        ...

    async def stop(self, lane: Lane) -> tuple[int, bool]:
        """`/stop`: how many queued runs were dropped, and whether a run not in the lane
        was stopped."""
        ...


class LaneHost(Protocol):
    """What commands and the goal driver need of the agent that owns the lanes."""

    store: Store
    events: EventLog
    clock: Clock
    factory: ConversationFactory
    prefs: ProviderPrefs
    goal_settings: GoalsConfig
    roles: Roles
    audit: AuditLog
    ledger: Ledger

    @property
    def dispatcher(self) -> LaneQueue:
        """The store's queue (`/stop`, `/status`)."""
        ...

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


__all__ = ["TERMINAL_STATES", "Lane", "LaneHost", "LaneQueue", "RunReport", "RunState"]
