"""The tool loop (SPEC §3): pure, stateless over a message list, emits events to a sink.

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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from core.events import (
    EventSink,
    LLMCallStarted,
    Notice,
    StreamDone,
    ToolFinished,
    ToolStarted,
    Usage,
    discard,
)
from core.messages import CANCELLED_RESULT, Message, ToolCall
from core.providers.base import Provider
from core.tokens import TokenCounter
from core.tools.base import Category, ToolSpec
from core.tools.executor import PreparedCall, ToolExecutor

MAX_ITERATIONS_TEXT = "Stopped: maximum iteration limit reached."
EMPTY_TURNS_TEXT = "Stopped: the model returned empty answers twice in a row."

Preflight = Callable[[list[Message]], Awaitable[None]]
"""Called before every LLM call with the history; may compact it in place or raise."""

StopReason = Literal["final", "max_iterations", "empty_turns"]


@dataclass(frozen=True, slots=True)
class LoopConfig:
    max_iterations: int = 20
    max_empty_turns: int = 2
    cancel_grace: float = 1.0
    parallel_reads: bool = True


@dataclass(slots=True)
class LoopOutcome:
    """How a turn ended; `text` is the final answer or the terminal notice."""

    reason: StopReason
    text: str
    iterations: int
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0


@dataclass(slots=True)
class _Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0


async def run_loop(
    messages: list[Message],
    provider: Provider,
    executor: ToolExecutor,
    *,
    config: LoopConfig = LoopConfig(),
    sink: EventSink = discard,
    counter: TokenCounter | None = None,
    preflight: Preflight | None = None,
) -> LoopOutcome:
    """Run one user turn to completion over `messages` (mutated in place)."""
    counter = counter or TokenCounter()
    totals = _Totals()
    tools = executor.registry.specs()
    empty_turns = 0
    for iteration in range(1, config.max_iterations + 1):
        if preflight is not None:
            await preflight(messages)
        sink(LLMCallStarted(iteration, provider.name, provider.model))
        done = await _stream_turn(provider, messages, tools, sink)
        usage = done.usage or _estimate(counter, messages, done.message)
        totals.input_tokens += usage.input_tokens
        totals.output_tokens += usage.output_tokens
        assistant = done.message
        if assistant.tool_calls:
            empty_turns = 0
            messages.append(assistant)
            await _run_tools(assistant.tool_calls, messages, executor, config, sink, totals)
            continue
        if assistant.content.strip():
            messages.append(assistant)
            return _outcome("final", assistant.content, iteration, totals)
        # An empty turn is not kept (providers reject empty assistant messages); retry.
        empty_turns += 1
        if empty_turns >= config.max_empty_turns:
            sink(Notice(EMPTY_TURNS_TEXT, "warning"))
            return _outcome("empty_turns", EMPTY_TURNS_TEXT, iteration, totals)
    messages.append(Message.assistant(MAX_ITERATIONS_TEXT))
    sink(Notice(MAX_ITERATIONS_TEXT, "warning"))
    return _outcome("max_iterations", MAX_ITERATIONS_TEXT, config.max_iterations, totals)


def _outcome(reason: StopReason, text: str, iterations: int, totals: _Totals) -> LoopOutcome:
    return LoopOutcome(
        reason, text, iterations, totals.input_tokens, totals.output_tokens, totals.tool_calls
    )


def _estimate(counter: TokenCounter, messages: Sequence[Message], reply: Message) -> Usage:
    return Usage(counter.messages(messages), counter.message(reply), estimated=True)


async def _stream_turn(
    provider: Provider, messages: Sequence[Message], tools: Sequence[ToolSpec], sink: EventSink
) -> StreamDone:
    # aclosing: a cancel closes the generator, and with it the HTTP response, at once.
    async with contextlib.aclosing(provider.stream(messages, tools)) as stream:
        async for event in stream:
            sink(event)
            if isinstance(event, StreamDone):
                return event
    raise AssertionError("provider stream ended without StreamDone")  # pragma: no cover


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


async def _run_tools(
    calls: Sequence[ToolCall],
    messages: list[Message],
    executor: ToolExecutor,
    config: LoopConfig,
    sink: EventSink,
    totals: _Totals,
) -> None:
    prepared = {c.id: executor.prepare(c) for c in calls}
    categories = {call_id: p.category for call_id, p in prepared.items()}
    results: dict[str, Message] = {}
    appended = 0
    try:
        for batch in _batches(calls, categories, config.parallel_reads):
            await asyncio.gather(
                *(_run_one(prepared[c.id], executor, config, sink, results) for c in batch)
            )
            messages.extend(results[c.id] for c in batch)
            appended += len(batch)
    except asyncio.CancelledError:
        for call in calls[appended:]:
            cancelled = Message.tool_result(call, CANCELLED_RESULT, is_error=True)
            messages.append(results.get(call.id, cancelled))
        raise
    finally:
        totals.tool_calls += len(results)


async def _run_one(
    prepared: PreparedCall,
    executor: ToolExecutor,
    config: LoopConfig,
    sink: EventSink,
    results: dict[str, Message],
) -> None:
    call, category = prepared.call, prepared.category
    sink(ToolStarted(call, category))
    started = time.perf_counter()
    task = asyncio.ensure_future(executor.execute(prepared))
    try:
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        if category != "read":
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
