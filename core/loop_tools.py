"""The tool phase of the loop (docs/loop.md): one assistant message's tool calls run, and
one result per call id appended in call order.

Consecutive read calls run concurrently as one batch; any other call runs alone. On
cancellation a read tool is stopped at once, while a write or admin tool gets the loop's
`cancel_grace` seconds to finish (a second cancel kills it); every call still without a
result then gets "operation cancelled by user", so the transcript stays valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from core.events import ToolFinished, ToolStarted
from core.loop_types import LoopConfig, LoopRun
from core.messages import CANCELLED_RESULT, Message, ToolCall
from core.run_context import RunContext
from core.tools.base import Category
from core.tools.executor import PreparedCall, ToolExecutor


def close_calls(messages: list[Message], calls: Sequence[ToolCall]) -> None:
    """Give each call that never got a result the cancelled result (a valid transcript)."""
    messages.extend(Message.tool_result(c, CANCELLED_RESULT, is_error=True) for c in calls)


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


async def run_tools(run: LoopRun, calls: Sequence[ToolCall], iteration: int) -> None:
    """Run `calls` (one assistant message's) in batches and append one result per call
    id, in call order, checkpointing after each batch. Cancelled, every call without a
    result yet gets the cancelled one before the `CancelledError` goes on."""
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
