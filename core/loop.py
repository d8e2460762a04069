"""The tool loop (docs/loop.md): pure, stateless over a message list, emits events to a sink.

Per iteration: pre-flight check → stream one LLM call → append the assistant message →
run its tool calls (one result per call id, in call order) → loop, until a final answer.

Cancellation is the caller cancelling the task that runs `run_loop`. It reaches every
phase: the HTTP stream is closed at once, read tools are killed at once, write/admin
tools get `cancel_grace` seconds to finish (a second cancel kills them), and every
outstanding call still gets the result "operation cancelled by user" before the
`CancelledError` propagates, so the transcript stays valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, Protocol

from core import metrics
from core.context.tokens import TokenCounter
from core.cost.call import CURRENT_RUN, complete_call
from core.errors import BudgetExceeded, ContextLengthError, ProviderError
from core.events import (
    EventSink,
    LLMCallStarted,
    Notice,
    TokensEstimated,
    ToolFinished,
    ToolStarted,
)
from core.messages import CANCELLED_RESULT, Message, ToolCall
from core.metrics import error_kind
from core.providers.base import Provider
from core.records import record
from core.resilience import (
    HARD_LIMIT_TEXT,
    SOFT_LIMIT_NOTICE,
    SOFT_LIMIT_PROMPT,
    LoopDetector,
    TimeLimits,
)
from core.run_context import DETACHED, RunContext
from core.tools.ask import ASK_HUMAN
from core.tools.base import Category, ToolSpec
from core.tools.executor import PreparedCall, ToolExecutor
from core.tools.search import ToolSearch, offered_specs

if TYPE_CHECKING:
    from core.context.manager import CompactionReport

MAX_ITERATIONS_TEXT = "Stopped: maximum iteration limit reached."
EMPTY_TURNS_TEXT = "Stopped: the model returned empty answers twice in a row."
CONTEXT_ASK_TEXT = (
    "This conversation has grown past what the model can hold, even after compacting it. "
    "Should I keep going, change direction, or stop? (/compact or /clear also help.)"
)
CONTEXT_STOP_TEXT = "Stopped: the conversation outgrew the model's context even after compacting."
NUDGE_PREFIX = "[Parley loop guard] "

StopReason = Literal[
    "final",
    "max_iterations",
    "empty_turns",
    "waiting_on_human",
    "doom_loop",
    "loop_stop",
    "time_limit",
    "context_stop",
    "budget",
]


class ContextGuard(Protocol):
    """Context management (docs/context.md): what the loop needs, and what a conversation's
    commands read (`/status`, `/compact`, `/clear`)."""

    last_compaction: CompactionReport | None
    after_summary: Callable[[], str] | None  # text placed after any history summary

    def start_turn(self) -> None: ...

    def tokens(self, messages: list[Message]) -> int: ...

    async def preflight(
        self, messages: list[Message], sink: EventSink
    ) -> Literal["ok", "ask_human", "stop"]: ...

    async def compact(self, messages: list[Message], *, sink: EventSink) -> CompactionReport: ...

    async def process_tool_result(self, result: Message, *, approved: bool) -> Message: ...

    def subgoal_status(self) -> str | None:
        """The subgoal in progress for `/status`; None when the strategy tracks none."""

    def focus_status(self, messages: list[Message]) -> str | None:
        """The active focus and the Knowledge block's size for `/status`; None unless the
        strategy is focus."""


@record(frozen=True, slots=True)
class LoopConfig:
    max_iterations: int = 20
    max_empty_turns: int = 2
    cancel_grace: float = 1.0
    parallel_reads: bool = True


@record(slots=True)
class Guards:
    """Optional protections of a conversation's runs; each is None when not wanted.

    `detector` and `limits` are templates: every run works on its own fresh copy (made by
    `for_run`), so no run's window, clock or events reach another.
    """

    context: ContextGuard | None = None
    detector: LoopDetector | None = None
    limits: TimeLimits | None = None

    def for_run(self, sink: EventSink) -> Guards:
        """This run's guards: fresh detector and limits that report to `sink`."""
        if self.context is not None:
            self.context.start_turn()
        detector = replace(self.detector, sink=sink) if self.detector is not None else None
        limits = replace(self.limits, sink=sink) if self.limits is not None else None
        if limits is not None:
            limits.start()
        return Guards(self.context, detector, limits)


@record(slots=True)
class LoopOutcome:
    """How a turn ended; `text` is the final answer or the terminal notice."""

    reason: StopReason
    text: str
    iterations: int
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0


@record(slots=True)
class _Run:
    """What one `run_loop` call carries between its steps."""

    messages: list[Message]
    provider: Provider
    executor: ToolExecutor
    config: LoopConfig
    ctx: RunContext
    counter: TokenCounter
    guards: Guards
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    iteration: int = 0
    search: ToolSearch | None = None  # more tools than one request carries
    # The registry's specs and what the run's role is offered of them, worked out once.
    offered: tuple[Sequence[ToolSpec], Sequence[ToolSpec]] | None = None

    @property
    def sink(self) -> EventSink:
        return self.ctx.sink

    def tools(self) -> Sequence[ToolSpec]:
        """What the next request carries: every tool the run's role allows, or the ones
        its tool search offers (docs/governance.md#roles)."""
        if self.search is not None:
            return self.search.specs()
        registry = self.executor.registry
        specs = registry.specs()
        if self.ctx.role is None:
            return specs
        if self.offered is None or self.offered[0] is not specs:
            self.offered = (specs, offered_specs(registry, self.ctx.role))
        return self.offered[1]

    def checkpoint(self, kind: str, iteration: int) -> None:
        if self.ctx.recorder is not None:
            self.ctx.recorder.checkpoint(kind, iteration, self.messages)

    def outcome(self, reason: StopReason, text: str, iterations: int) -> LoopOutcome:
        return LoopOutcome(
            reason, text, iterations, self.input_tokens, self.output_tokens, self.tool_calls
        )


async def run_loop(
    messages: list[Message],
    provider: Provider,
    executor: ToolExecutor,
    ctx: RunContext = DETACHED,
    *,
    config: LoopConfig = LoopConfig(),
    counter: TokenCounter | None = None,
    guards: Guards | None = None,
) -> LoopOutcome:
    """Run one user turn to completion over `messages` (mutated in place), for the run
    `ctx` describes (its events, checkpoints, tool envelope, approver and deadline).

    If `messages` ends with an assistant message whose tool calls have no results yet (a
    run resumed after a crash), those calls run first; an executor with an idempotency
    envelope replays the ones that had completed.
    """
    run_guards = (guards or Guards()).for_run(ctx.sink)
    search = None
    if ToolSearch.wanted(executor.registry):
        search = ToolSearch(executor.registry, ctx.role).seed(messages)
        ctx = replace(ctx, search=search)
    run = _Run(
        messages,
        provider,
        executor,
        config,
        ctx,
        counter or TokenCounter(),
        run_guards,
        search=search,
    )
    current = CURRENT_RUN.set(ctx)  # summaries made for it are metered too (docs/cost.md)
    try:
        return await _run(run, run_guards.limits, ctx)
    finally:
        CURRENT_RUN.reset(current)


async def _run(run: _Run, limits: TimeLimits | None, ctx: RunContext) -> LoopOutcome:
    messages = run.messages
    remaining = _remaining(limits, ctx)
    if remaining is None:
        return await _turn(run)
    # The hard limit bounds everything the turn awaits: a stream that never ends, a long
    # Retry-After, a tool that outlives it (its process group is killed on cancellation).
    deadline = asyncio.timeout(remaining)
    try:
        async with deadline:
            return await _turn(run)
    except TimeoutError:
        if not deadline.expired():
            raise
    if limits is not None:
        limits.check()  # records the hard-limit event
    if pending := unanswered_calls(messages):
        close_calls(messages, pending)
    messages.append(Message.assistant(HARD_LIMIT_TEXT))
    ctx.sink(Notice(HARD_LIMIT_TEXT, "warning"))
    return run.outcome("time_limit", HARD_LIMIT_TEXT, run.iteration)


def _remaining(limits: TimeLimits | None, ctx: RunContext) -> float | None:
    """Seconds the turn may take: the hard limit, or less if the run's deadline is nearer."""
    left = [limits.remaining] if limits is not None else []
    if ctx.deadline is not None:
        left.append(max(0.0, ctx.deadline - asyncio.get_running_loop().time()))
    return min(left, default=None)


async def _turn(run: _Run) -> LoopOutcome:
    """The turn's iterations; a call a budget refuses ends it with the refusal as its
    answer (docs/cost.md#budgets): the history stays valid, nothing is lost."""
    try:
        return await _iterations(run)
    except BudgetExceeded as refused:
        text = str(refused)
        run.messages.append(Message.assistant(text))
        run.sink(Notice(text, "warning"))
        return run.outcome("budget", text, run.iteration)


async def _iterations(run: _Run) -> LoopOutcome:
    messages, config, sink = run.messages, run.config, run.sink
    empty_turns = 0
    if pending := unanswered_calls(messages):
        await _run_tools(run, pending, 0)
        if (stop := await _after_tools(run, pending, 0)) is not None:
            return stop
    for iteration in range(1, config.max_iterations + 1):
        run.iteration = iteration
        if (stop := await _before_call(run, iteration)) is not None:
            return stop
        assistant = await _call(run, iteration, run.tools())
        if assistant.tool_calls:
            empty_turns = 0
            messages.append(assistant)
            run.checkpoint("llm", iteration)
            if run.search is not None:  # a tool the history names stays offered
                run.search.add(call.name for call in assistant.tool_calls)
            await _run_tools(run, assistant.tool_calls, iteration)
            if (stop := await _after_tools(run, assistant.tool_calls, iteration)) is not None:
                return stop
            continue
        if assistant.content.strip():
            messages.append(assistant)
            return run.outcome("final", assistant.content, iteration)
        # An empty turn is not kept (providers reject empty assistant messages); retry.
        empty_turns += 1
        if empty_turns >= config.max_empty_turns:
            sink(Notice(EMPTY_TURNS_TEXT, "warning"))
            return run.outcome("empty_turns", EMPTY_TURNS_TEXT, iteration)
    messages.append(Message.assistant(MAX_ITERATIONS_TEXT))
    sink(Notice(MAX_ITERATIONS_TEXT, "warning"))
    return run.outcome("max_iterations", MAX_ITERATIONS_TEXT, config.max_iterations)


def close_calls(messages: list[Message], calls: Sequence[ToolCall]) -> None:
    """Give each call that never got a result the cancelled result (a valid transcript)."""
    messages.extend(Message.tool_result(c, CANCELLED_RESULT, is_error=True) for c in calls)


async def _before_call(run: _Run, iteration: int) -> LoopOutcome | None:
    """Time limits and context pressure, checked before every LLM call."""
    guards = run.guards
    if guards.limits is not None:
        match guards.limits.check():
            case "hard":
                run.messages.append(Message.assistant(HARD_LIMIT_TEXT))
                run.sink(Notice(HARD_LIMIT_TEXT, "warning"))
                return run.outcome("time_limit", HARD_LIMIT_TEXT, iteration)
            case "soft":
                return await _summary_turn(
                    run, iteration, "time_limit", SOFT_LIMIT_NOTICE, fallback=HARD_LIMIT_TEXT
                )
    if guards.context is not None:
        match await guards.context.preflight(run.messages, run.sink):
            case "ask_human":
                run.messages.append(Message.assistant(CONTEXT_ASK_TEXT))
                return run.outcome("waiting_on_human", CONTEXT_ASK_TEXT, iteration)
            case "stop":  # cron: nobody to ask, so stop with a summary
                return await _summary_turn(
                    run, iteration, "context_stop", CONTEXT_STOP_TEXT, prefix=True
                )
    return None


async def _summary_turn(
    run: _Run,
    iteration: int,
    reason: StopReason,
    notice: str,
    *,
    prefix: bool = False,
    fallback: str | None = None,
) -> LoopOutcome:
    """One last call without tools to summarise what was done (the soft time limit, and a
    cron run that has to stop). `prefix`: the answer starts with `notice`; with no summary
    the answer is `fallback` (default: `notice`)."""
    run.sink(Notice(notice, "warning"))
    run.messages.append(Message.user(SOFT_LIMIT_PROMPT))
    assistant = await _call(run, iteration, ())
    summary = assistant.content.strip()
    text = f"{notice}\n\n{summary}" if summary and prefix else summary
    text = text or fallback or notice
    run.messages.append(Message.assistant(text))  # tool calls, if any, are dropped
    return run.outcome(reason, text, iteration)


async def _call(run: _Run, iteration: int, tools: Sequence[ToolSpec]) -> Message:
    """One LLM call. A provider that still says "context too long" gets one compaction
    and one retry."""
    run.sink(LLMCallStarted(iteration, run.provider.name, run.provider.model))
    try:
        try:
            done, usage = await complete_call(
                run.provider, run.messages, tools, run.ctx, run.counter
            )
        except ContextLengthError:
            if run.guards.context is None:
                raise
            await run.guards.context.compact(run.messages, sink=run.sink)
            done, usage = await complete_call(
                run.provider, run.messages, tools, run.ctx, run.counter
            )
    except ProviderError as exc:
        metrics.llm_error(run.provider.name, error_kind(exc))
        raise
    if done.usage is None:
        run.sink(TokensEstimated(usage))
    run.input_tokens += usage.input_tokens
    run.output_tokens += usage.output_tokens
    return done.message


async def _after_tools(run: _Run, calls: Sequence[ToolCall], iteration: int) -> LoopOutcome | None:
    """`ask_human` ends the turn; loop detection nudges, then stops."""
    for call in calls:
        if call.name == ASK_HUMAN:
            question = _question(call)
            run.messages.append(Message.assistant(question))
            return run.outcome("waiting_on_human", question, iteration)
    detector = run.guards.detector
    if detector is None:
        return None
    results = {m.tool_call_id: m for m in run.messages[-len(calls) :]}
    verdicts = [v for c in calls if (v := detector.observe(c, results[c.id])) is not None]
    if not verdicts:
        return None
    verdict = max(verdicts, key=lambda v: (v.stops, v.level))
    if not verdict.stops:
        run.messages.append(Message.user(NUDGE_PREFIX + verdict.message))
        return None
    if run.executor.policy.session == "cron" and verdict.kind != "doom":
        # Nobody to ask in a cron job: stop, with a summary of what was done.
        return await _summary_turn(run, iteration, "loop_stop", verdict.message, prefix=True)
    run.messages.append(Message.assistant(verdict.message))
    run.sink(Notice(verdict.message, "warning"))
    if verdict.kind == "doom":
        return run.outcome("doom_loop", verdict.message, iteration)
    return run.outcome("waiting_on_human", verdict.message, iteration)


def _question(call: ToolCall) -> str:
    try:
        question = call.parsed_arguments().get("question")
    except (ValueError, AttributeError):
        question = None
    return str(question or "I need your input to go on: what should I do next?")


def _batches(
    calls: Sequence[ToolCall], categories: dict[str, Category], parallel: bool
) -> list[list[ToolCall]]:
    """Consecutive read calls form one concurrent batch; any other call runs alone."""
    batches: list[list[ToolCall]] = []
    for call in calls:
        joins = parallel and batches and categories[batches[-1][0].id] == "read"
        if joins and categories[call.id] == "read":
            batches[-1].append(call)
        else:
            batches.append([call])
    return batches


def unanswered_calls(messages: Sequence[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message that have no result after it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in messages[index + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in answered]
        if message.role != "tool":
            return []
    return []


async def _run_tools(run: _Run, calls: Sequence[ToolCall], iteration: int) -> None:
    executor, config, messages = run.executor, run.config, run.messages
    prepared = {c.id: executor.prepare(c, run.ctx.role) for c in calls}
    categories = {call_id: p.category for call_id, p in prepared.items()}
    results: dict[str, Message] = {}
    appended = 0
    try:
        for batch in _batches(calls, categories, config.parallel_reads):
            runs = [_run_one(prepared[c.id], executor, config, run.ctx, results) for c in batch]
            if len(runs) == 1:
                await runs[0]  # no task to spawn for a lone call
            else:
                await asyncio.gather(*runs)
            if run.guards.context is not None:  # TACO: shrink huge outputs before history
                for c in batch:
                    approved = categories[c.id] == "admin"
                    results[c.id] = await run.guards.context.process_tool_result(
                        results[c.id], approved=approved
                    )
            messages.extend(results[c.id] for c in batch)
            appended += len(batch)
            run.checkpoint("tool", iteration)
    except asyncio.CancelledError:
        for call in calls[appended:]:
            cancelled = Message.tool_result(call, CANCELLED_RESULT, is_error=True)
            messages.append(results.get(call.id, cancelled))
        raise
    finally:
        run.tool_calls += len(results)


async def _run_one(
    prepared: PreparedCall,
    executor: ToolExecutor,
    config: LoopConfig,
    ctx: RunContext,
    results: dict[str, Message],
) -> None:
    call, category, sink = prepared.call, prepared.category, ctx.sink
    sink(ToolStarted(call, category))
    started = time.perf_counter()
    if category == "read":  # nothing to let finish: a cancel reaches the tool at once
        results[call.id] = result = await executor.execute(prepared, ctx)
        sink(ToolFinished(call, result, time.perf_counter() - started))
        return
    task = asyncio.ensure_future(executor.execute(prepared, ctx))
    try:
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        # Give a side-effecting tool a moment to finish rather than leave it half done;
        # a second cancel during this wait kills it at once.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=config.cancel_grace)
        if task.done() and not task.cancelled() and task.exception() is None:
            results[call.id] = task.result()
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        raise
    results[call.id] = result
    sink(ToolFinished(call, result, time.perf_counter() - started))
