"""The tool loop (docs/loop.md): pure, stateless over a message list, emits events to a sink.

Per iteration: pre-flight check → stream one LLM call → append the assistant message →
run its tool calls (one result per call id, in call order) → loop, until a final answer.

Cancellation is the caller cancelling the task that runs `run_loop`. It reaches every
phase: the HTTP stream is closed at once, read tools are killed at once, write/admin
tools get `cancel_grace` seconds to finish (a second cancel kills them), and every
outstanding call still gets the result "operation cancelled by user" before the
`CancelledError` propagates, so the transcript stays valid.

This module is the iterations and the guards checked between them; the tool phase
(batches, the grace period, the cancelled results) is `core.loop_tools`, and the loop's
data (`LoopConfig`, `Guards`, `LoopOutcome`, `LoopRun`) is `core.loop_types`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from core import metrics
from core.context.tokens import TokenCounter
from core.cost.call import CURRENT_RUN, complete_call
from core.errors import BudgetExceeded, ContextLengthError, ProviderError
from core.events import LLMCallStarted, Notice, TokensEstimated
from core.loop_tools import close_calls, run_tools, unanswered_calls
from core.loop_types import ContextGuard, Guards, LoopConfig, LoopOutcome, LoopRun, StopReason
from core.messages import Message, ToolCall
from core.metrics import error_kind
from core.providers.base import Provider
from core.resilience import HARD_LIMIT_TEXT, SOFT_LIMIT_NOTICE, SOFT_LIMIT_PROMPT, TimeLimits
from core.run_context import DETACHED, RunContext
from core.tools.ask import ASK_HUMAN
from core.tools.base import ToolSpec
from core.tools.executor import ToolExecutor
from core.tools.search import ToolSearch

MAX_ITERATIONS_TEXT = "Stopped: maximum iteration limit reached."
EMPTY_TURNS_TEXT = "Stopped: the model returned empty answers twice in a row."
CONTEXT_ASK_TEXT = (
    "This conversation has grown past what the model can hold, even after compacting it. "
    "Should I keep going, change direction, or stop? (/compact or /clear also help.)"
)
CONTEXT_STOP_TEXT = "Stopped: the conversation outgrew the model's context even after compacting."
NUDGE_PREFIX = "[Parley loop guard] "


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
    run = LoopRun(
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


async def _run(run: LoopRun, limits: TimeLimits | None, ctx: RunContext) -> LoopOutcome:
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


async def _turn(run: LoopRun) -> LoopOutcome:
    """The turn's iterations; a call a budget refuses ends it with the refusal as its
    answer (docs/cost.md#budgets): the history stays valid, nothing is lost."""
    try:
        return await _iterations(run)
    except BudgetExceeded as refused:
        text = str(refused)
        run.messages.append(Message.assistant(text))
        run.sink(Notice(text, "warning"))
        return run.outcome("budget", text, run.iteration)


async def _iterations(run: LoopRun) -> LoopOutcome:
    messages, config, sink = run.messages, run.config, run.sink
    empty_turns = 0
    if pending := unanswered_calls(messages):
        await run_tools(run, pending, 0)
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
            await run_tools(run, assistant.tool_calls, iteration)
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


async def _before_call(run: LoopRun, iteration: int) -> LoopOutcome | None:
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
    run: LoopRun,
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


async def _call(run: LoopRun, iteration: int, tools: Sequence[ToolSpec]) -> Message:
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


async def _after_tools(
    run: LoopRun, calls: Sequence[ToolCall], iteration: int
) -> LoopOutcome | None:
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


__all__ = [  # the data lives in `core.loop_types`, the tool phase in `core.loop_tools`
    "CONTEXT_ASK_TEXT",
    "CONTEXT_STOP_TEXT",
    "EMPTY_TURNS_TEXT",
    "MAX_ITERATIONS_TEXT",
    "NUDGE_PREFIX",
    "ContextGuard",
    "Guards",
    "LoopConfig",
    "LoopOutcome",
    "LoopRun",
    "StopReason",
    "close_calls",
    "run_loop",
    "unanswered_calls",
]
