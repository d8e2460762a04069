"""One LLM call of the loop (docs/loop.md), as the cost rules want it (docs/cost.md): for
the conversation's prompt cache, held to the budgets before, priced and recorded after."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import replace

from core.context.tokens import TokenCounter, tool_tokens
from core.events import LoopEvent, StreamDone, Usage, discard
from core.messages import Message
from core.providers.base import CACHE_SCOPE, Provider
from core.run_context import RunContext
from core.tools.base import ToolSpec

CURRENT_RUN: ContextVar[RunContext | None] = ContextVar("current_run", default=None)
"""The run whose loop is running in this task (set by `core.loop.run_loop`): the calls a
run makes beside its own — compaction summaries, subgoal extraction — are metered and
held to its budgets too (`side_call`)."""


async def side_call(
    provider: Provider, messages: Sequence[Message], counter: TokenCounter
) -> StreamDone:
    """A call made for the current run but not by its loop (a summary): metered like the
    loop's, its events kept out of the run's reply. Outside a run, a plain call.

    Raises:
        BudgetExceeded: a budget refused it (the caller's fallback takes over).
    """
    ctx = CURRENT_RUN.get()
    if ctx is None or ctx.meter is None:
        return await provider.complete(messages)
    done, _ = await complete_call(provider, messages, (), replace(ctx, sink=discard), counter)
    return done


async def complete_call(
    provider: Provider,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    ctx: RunContext,
    counter: TokenCounter,
) -> tuple[StreamDone, Usage]:
    """One provider call and its usage (counted here if the provider sent none).

    Raises:
        BudgetExceeded: the run's meter refused the call; nothing was sent.
    """
    scope = CACHE_SCOPE.set(ctx.conv)
    try:
        meter = ctx.meter
        if meter is None:
            done = await provider.complete(messages, tools, ctx.sink)
            return done, done.usage or estimate(counter, messages, done.message)
        settings = provider.settings
        kind, model = settings.kind, provider.model
        # the prompt is counted only when a budget applies (docs/cost.md#budgets)
        prompt = lambda: counter.messages(messages) + tool_tokens(counter, tools)  # noqa: E731
        held = await meter.reserve(kind, model, prompt, settings.max_output_tokens)
        settled = False

        def priced(event: LoopEvent) -> None:
            """The `StreamDone` goes on with its cost: the run's events record it."""
            nonlocal settled
            if isinstance(event, StreamDone):
                usage = event.usage or estimate(counter, messages, event.message)
                settled = True
                event = replace(event, cost=meter.settle(held, provider.name, kind, model, usage))
            ctx.sink(event)

        try:
            done = await provider.complete(messages, tools, priced)
        finally:
            if not settled:  # failed or cancelled: what it held is freed
                meter.settle(held, provider.name, kind, model, None)
        return done, done.usage or estimate(counter, messages, done.message)
    finally:
        CACHE_SCOPE.reset(scope)


def estimate(counter: TokenCounter, messages: Sequence[Message], reply: Message) -> Usage:
    return Usage(counter.messages(messages), counter.message(reply), estimated=True)
