"""Child runs (docs/delegation-memory.md#delegation): what the `delegate` tool starts.

Each child is a durable run of its own — a row in the store with `parent_run_id`,
checkpoints, its own idempotency envelope — in its own lane keyed on a child conversation
of the parent (`<parent conv>:child:<child run id>`), so children neither wait for the
parent's lane nor for each other. A child is created `running` in the parent's process,
never `queued`: no other worker can claim it.

A child gets at most what its parent has: the tools its parent's policy lets run (the
intersection with the ones the task names; a cron job's children keep the job's policy),
no approver (its admin actions are refused), an iteration budget no larger than the
parent's, and a deadline a little before the parent's own (`RESERVE_SHARE`).

Durability. The children's ids are chosen before any starts, and recorded with the
`agent.delegate.started` event of the parent (call id and a digest of the tasks), which
is committed before the first child row is. `delegate` is `resumable`: when a parent
resumed after a crash runs its open `delegate` call again, the children of that call are
found through that event and each is
    - replayed from its row (state, final text) if it had finished;
    - resumed like any interrupted run if it had a checkpoint: its own completed calls are
      replayed, and a side-effecting call that started but never finished halts it to
      `waiting_on_human` (never a duplicate side effect);
    - started from its instruction if it had not reached its first checkpoint.
`/stop` on the parent cancels the `delegate` call, which cancels every child (their tools
are killed as in any cancelled run). A child that crashes ends `failed`; its siblings go on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import replace

from core.agent.conversation import Conversation
from core.agent.journal import JournalBox
from core.agent.lane import TERMINAL_STATES, Lane, RunReport
from core.agent.recovery import parse_conv
from core.agent.responders import QuietResponder
from core.agent.runs import resume_blocker
from core.agent.turn import ParentLink, Turn, TurnHost, new_run_id
from core.context.manager import ContextManager
from core.errors import ToolValidationError
from core.eventlog import RunEvents
from core.loop import Guards
from core.messages import Message
from core.records import record
from core.store import RunRow
from core.tools.base import RoleGate, Tool, ToolRegistry
from core.tools.delegate import DELEGATE, DelegateTool
from core.tools.delegation import ChildOutcome, ChildTask
from core.tools.executor import ToolExecutor

log = logging.getLogger(__name__)

CHILD_PROMPT = (
    "You are a child run: another run delegated one task to you. Do it with the tools you "
    "have, then answer with a concise, self-contained report of what you found or did: "
    "your final answer is all the delegating run sees."
)
RESERVE_SHARE = 0.1
"""Of the time the parent has left, what it keeps for itself after its children's
deadline (at most `RESERVE_MAX` seconds), to use their results."""
RESERVE_MAX = 60.0
STORED_TEXT = 2000  # what a run row keeps of the final text (`Turn._record`)


def child_conv(parent_conv: str, run_id: str) -> str:
    """The child's conversation id: `slack:C1:1700.1:child:<run id>` (the thread part of
    the key carries the rest, see `parse_conv`)."""
    return f"{parent_conv}:child:{run_id}"


@record(frozen=True, slots=True)
class _Plan:
    task: ChildTask
    tools: tuple[Tool, ...]
    max_iterations: int


@record(slots=True)
class Children:
    """The `Delegator` of one run: starts its children, waits for them, reports."""

    host: TurnHost
    lane: Lane  # the parent's
    conversation: Conversation  # the parent's
    run_id: str  # the parent's
    depth: int  # the parent's
    max_depth: int
    end: float | None  # loop time by which the parent must end
    resumed: set[str]  # the parent's calls a resume left open (only these find children)
    sink: RunEvents  # the parent's
    role: RoleGate | None = None  # the parent's: its children may use no more

    async def delegate(self, call_id: str, tasks: Sequence[ChildTask]) -> list[ChildOutcome]:
        """`core.tools.delegation.Delegator.delegate`."""
        plans = [self._plan(task) for task in tasks]  # refuses before anything starts
        earlier = await self._earlier_ids(call_id, tasks)
        ids = earlier or [new_run_id() for _ in tasks]
        started = {"call_id": call_id, "children": ids, "tasks": _digest(tasks)}
        self.sink.emit("agent.delegate.started", {**started, "resumed": bool(earlier)})
        deadline = self._deadline()
        jobs = [
            asyncio.create_task(self._child(plan, run_id, deadline, bool(earlier)), name=run_id)
            for plan, run_id in zip(plans, ids, strict=True)
        ]
        try:
            await asyncio.wait(jobs)
        except asyncio.CancelledError:  # the parent was stopped: so are its children
            for job in jobs:
                job.cancel()
            await asyncio.wait(jobs)
            raise
        outcomes = [job.result() for job in jobs]
        self.sink.emit(
            "agent.delegate.finished",
            {"call_id": call_id, "states": {o.run_id: o.state for o in outcomes}},
        )
        return outcomes

    # --- what a child may use ----------------------------------------------------------

    def _plan(self, task: ChildTask) -> _Plan:
        """The child's tools (what this run's role and its policy let run with nobody to
        ask, narrowed to the task's list) and budget. Raises ToolValidationError for a
        tool the parent cannot give."""
        registry = self.conversation.executor.registry
        policy = self.conversation.executor.policy.without_approvals()  # the child's
        usable: dict[str, Tool] = {}
        refused: dict[str, str] = {}
        for name in registry.names():
            tool = registry.get(name)
            assert tool is not None
            decision = policy.decide(name, tool.category)
            if name == DELEGATE and self.depth + 1 >= self.max_depth:
                refused[name] = "children may not delegate further ([agent] max_depth)"
            elif self.role is not None and (why := self.role.tool_refusal(name, tool.category)):
                refused[name] = why
            elif decision.verdict == "deny":
                refused[name] = decision.reason
            else:
                usable[name] = tool
        if task.tools is not None:
            available = ", ".join(usable) or "none"
            unknown = [n for n in task.tools if n not in usable and n not in refused]
            if unknown:
                raise ToolValidationError(
                    f"unknown tool {_names(unknown)} for a child run; available: {available}"
                )
            if denied := [n for n in task.tools if n in refused]:
                why = "; ".join(f"`{n}`: {refused[n]}" for n in denied)
                raise ToolValidationError(
                    f"a child run cannot have {_names(denied)} ({why}); it gets at most the "
                    f"tools this run may use: {available}"
                )
        wanted = set(task.tools) if task.tools is not None else set(usable)
        budget = self.conversation.loop_config.max_iterations
        iterations = min(task.max_iterations or budget, budget)
        return _Plan(task, tuple(t for n, t in usable.items() if n in wanted), iterations)

    def _deadline(self) -> float | None:
        if self.end is None:
            return None
        left = max(0.0, self.end - asyncio.get_running_loop().time())
        return self.end - min(RESERVE_MAX, left * RESERVE_SHARE)

    async def _earlier_ids(self, call_id: str, tasks: Sequence[ChildTask]) -> list[str] | None:
        """The children an interrupted run of this same call had started, or None."""
        if call_id not in self.resumed:
            return None
        self.resumed.discard(call_id)
        for _at, name, _iteration, data in reversed(await self.host.store.events(self.run_id)):
            if name == "agent.delegate.started" and data.get("call_id") == call_id:
                children = data.get("children")
                if data.get("tasks") != _digest(tasks) or not isinstance(children, list):
                    return None
                return [str(c) for c in children]
        return None

    # --- one child -----------------------------------------------------------------------

    async def _child(
        self, plan: _Plan, run_id: str, deadline: float | None, resumed: bool
    ) -> ChildOutcome:
        """One child, start to end; never raises but for cancellation (a crash is this
        child's `failed` outcome, not its siblings' problem)."""
        try:
            return await self._run_child(plan, run_id, deadline, resumed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("child run %s crashed", run_id)
            self.host.store.set_run_state(run_id, "failed", "crashed")
            return ChildOutcome(run_id, "failed", f"the child run crashed ({type(exc).__name__})")

    async def _run_child(
        self, plan: _Plan, run_id: str, deadline: float | None, resumed: bool
    ) -> ChildOutcome:
        store = self.host.store
        conv = child_conv(self.lane.conv_id, run_id)
        row = await store.run(run_id) if resumed else None
        if row is not None and _finished(row):
            return await self._replay(row)
        lane = await self._lane(conv)
        conversation = child_conversation(self.conversation, lane.journal, plan)
        conversation.workspace = self.conversation.workspace  # its parent's (its prompt names it)
        conversation.messages = await store.load_messages(conv)
        lane.pin(conversation, self.lane.provider_name)
        user_text: str | None = plan.task.instruction
        resume = False
        if row is None:
            await store.create_run(run_id, conv, "child", parent_run_id=self.run_id)
        elif await store.last_checkpoint(run_id) is not None:  # interrupted on the way
            if (why := await resume_blocker(store, run_id, conversation)) is not None:
                return self._halt(row, conversation, why)
            user_text, resume = None, True
        # else: its row was made but it never reached a checkpoint: it ran nothing yet
        report = await self._turn(lane, user_text, run_id, resume, deadline)
        return ChildOutcome(
            run_id,
            report.state,
            report.failure or report.text,
            _artifacts(conversation.messages, lane.journal),
            report.iterations,
        )

    async def _turn(
        self, lane: Lane, user_text: str | None, run_id: str, resume: bool, deadline: float | None
    ) -> RunReport:
        """The child's run as its lane's run task; a cancel reaches it and is waited for."""
        link = ParentLink(self.run_id, self.depth + 1, deadline, self.role)
        turn = Turn(self.host, lane, QuietResponder(), user_text, "child", run_id, resume, link)
        async with lane.lock:
            task = asyncio.create_task(turn.run(), name=f"run {lane.conv_id}")
            lane.run_as(task)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()
                await asyncio.wait({task})
                if task.cancelled():  # stopped before it began: it never ran, record that
                    self.host.store.set_run_state(run_id, "cancelled", "stopped")
                raise

    async def _lane(self, conv: str) -> Lane:
        """The child's own lane, with its journal and history from the store (owned by
        this delegation, not by the agent's lane table: nobody else sends to it)."""
        store = self.host.store
        journal = JournalBox.from_data(
            await store.journal(conv), lambda j: store.save_journal(conv, j.model_dump())
        )
        return Lane(parse_conv(conv), conv, journal)

    async def _replay(self, row: RunRow) -> ChildOutcome:
        """A child that had finished: its outcome as stored, nothing run again."""
        store = self.host.store
        messages = await store.load_messages(row.conv)
        text = row.text or row.reason or ""
        if len(text) >= STORED_TEXT:  # the row keeps a prefix; the transcript has it whole
            answers = [m.content for m in messages if m.role == "assistant" and m.content]
            text = answers[-1] if answers else text
        journal = JournalBox.from_data(await store.journal(row.conv), None)
        artifacts = _artifacts(messages, journal)
        return ChildOutcome(row.id, row.state, text, artifacts, row.iterations, replayed=True)

    def _halt(self, row: RunRow, conversation: Conversation, why: str) -> ChildOutcome:
        """An interrupted child that cannot safely go on waits for a human (as any run)."""
        store = self.host.store
        text = f"I can't safely resume this child run: {why}."
        conversation.messages.append(Message.assistant(text))
        store.save_messages(row.conv, conversation.messages)
        store.set_run_state(row.id, "waiting_on_human", "unsafe", resumable=False)
        self.host.events.emit(
            "agent_run.resume_unsafe",
            {"why": why, "parent_run_id": self.run_id},
            run_id=row.id,
            conv=row.conv,
        )
        return ChildOutcome(row.id, "waiting_on_human", text, (), row.iterations)


def delegator_for(host: TurnHost, turn: Turn) -> Children | None:
    """The delegator of `turn`, or None if it may not delegate (no `delegate` tool in its
    conversation, or it is as deep as `max_depth` allows)."""
    conversation, recorder = turn.conversation, turn.recorder
    if conversation is None or recorder is None:
        return None
    tool = conversation.executor.registry.get(DELEGATE)
    depth = turn.parent.depth if turn.parent is not None else 0
    if not isinstance(tool, DelegateTool) or depth >= tool.max_depth:
        return None
    ends = [] if turn.parent is None or turn.parent.deadline is None else [turn.parent.deadline]
    limits = conversation.guards.limits
    if limits is not None:
        ends.append(asyncio.get_running_loop().time() + limits.hard)
    return Children(
        host,
        turn.lane,
        conversation,
        turn.run_id,
        depth,
        tool.max_depth,
        min(ends, default=None),
        set(recorder.replayable),
        turn.sink,
        turn.role,
    )


def child_conversation(parent: Conversation, journal: JournalBox, plan: _Plan) -> Conversation:
    """The child's conversation: the parent's provider and sandbox, its policy without
    approvals, only the planned tools, its own journal and context manager."""
    executor = parent.executor
    child_executor = ToolExecutor(
        ToolRegistry(plan.tools),
        executor.policy.without_approvals(),
        replace(executor.ctx, journal=journal),
        executor.clock,
        executor.redact,
    )
    guards = parent.guards
    context = guards.context
    if isinstance(context, ContextManager):
        context = ContextManager(
            context.window,
            context.counter,
            context.summarizer,
            context.settings,
            context.session,
            context.artifacts_dir,
            after_summary=journal.render_full,
        )
    else:
        context = None
    return Conversation(
        provider=parent.provider,
        executor=child_executor,
        system_prompt=f"{parent.system_prompt}\n\n{CHILD_PROMPT}",
        instructions=parent.instructions,  # the parent's, as of the parent's turn
        skills=parent.skills,  # shown only if the child may call `load_skill`
        loop_config=replace(parent.loop_config, max_iterations=plan.max_iterations),
        counter=parent.counter,
        guards=Guards(context, guards.detector, guards.limits),
    )


def _finished(row: RunRow) -> bool:
    """The child ended and there is nothing to resume: replay it."""
    if row.state == "timed_out":
        return not row.resumable
    return row.state in TERMINAL_STATES


def _artifacts(messages: Sequence[Message], journal: JournalBox) -> tuple[str, ...]:
    """Files the child left: full outputs of its cut tool results, then its journal's."""
    found = dict.fromkeys(a for m in messages if m.role == "tool" for a in m.artifacts)
    found.update(dict.fromkeys(journal.journal.artifacts))
    return tuple(found)


def _digest(tasks: Sequence[ChildTask]) -> str:
    body = json.dumps([[t.instruction, t.tools, t.max_iterations] for t in tasks])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


__all__ = ["CHILD_PROMPT", "Children", "child_conv", "child_conversation", "delegator_for"]
