"""Events: what providers stream and what the loop emits to its caller.

Small frozen dataclasses with a literal `kind`, consumed with `match`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal

from core.messages import Message, ToolCall
from core.records import record

# ---- provider stream events -------------------------------------------------------------


@record(frozen=True, slots=True)
class TextDelta:
    text: str
    kind: Literal["text"] = "text"


@record(frozen=True, slots=True)
class ReasoningDelta:
    text: str
    kind: Literal["reasoning"] = "reasoning"


@record(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of tool call `index`; `id` and `name` come with the first fragment."""

    index: int
    id: str | None
    name: str | None
    arguments: str
    kind: Literal["tool_call_delta"] = "tool_call_delta"


@record(frozen=True, slots=True)
class Usage:
    """One call's tokens. `input_tokens` counts the whole prompt, cached parts included:
    `cached_tokens` of it were read from the provider's prompt cache, `cache_write_tokens`
    written to it (docs/cost.md#prompt-caching)."""

    input_tokens: int
    output_tokens: int
    estimated: bool = False
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    kind: Literal["usage"] = "usage"


@record(frozen=True, slots=True)
class StreamRestarted:
    """The call failed transiently and is retried after `delay` seconds.

    `discard` is true when the failed attempt already streamed output: the caller must
    drop what it showed of it.
    """

    attempt: int
    reason: str
    delay: float
    discard: bool
    kind: Literal["stream_restarted"] = "stream_restarted"


@record(frozen=True, slots=True)
class StreamDone:
    """The complete assistant message; always the last event of a stream."""

    message: Message
    stop_reason: str
    usage: Usage | None
    cost: float | None = None  # USD, once the run's meter priced it (docs/cost.md)
    kind: Literal["done"] = "done"


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta | Usage | StreamRestarted | StreamDone

# ---- loop events --------------------------------------------------------------------------


@record(frozen=True, slots=True)
class LLMCallStarted:
    iteration: int
    provider: str
    model: str
    kind: Literal["llm_call"] = "llm_call"


@record(frozen=True, slots=True)
class ToolStarted:
    call: ToolCall
    category: str
    kind: Literal["tool_started"] = "tool_started"


@record(frozen=True, slots=True)
class ToolFinished:
    call: ToolCall
    result: Message
    duration: float
    kind: Literal["tool_finished"] = "tool_finished"


@record(frozen=True, slots=True)
class Notice:
    """A line for the human (limits hit, empty turns, cancellation)."""

    text: str
    level: Literal["info", "warning", "error"] = "info"
    kind: Literal["notice"] = "notice"


EventName = Literal[
    # runs (docs/durability.md)
    "agent_run.started",
    "agent_run.completed",
    "agent_run.cancelled",
    "agent_run.failed",
    "agent_run.timed_out",
    "agent_run.waiting_on_human",
    "agent_run.queued",
    "agent_run.running",
    "agent_run.requeued",
    "agent_run.reconcile",
    "agent_run.resumed",
    "agent_run.resume_unsafe",
    "agent_run.paused",
    "agent_run.skipped",
    "agent_run.lost",
    # the loop and its guards (docs/loop.md, docs/durability.md)
    "agent.llm.call",
    "agent.llm.usage",
    "agent.llm.retry",
    "agent.provider.failover",
    "agent.provider.unavailable",
    "agent.tool.call",
    "agent.tool.retry",
    "agent.loop.detected",
    "agent.exhaustion.soft_limit",
    "agent.exhaustion.hard_limit",
    # context (docs/context.md)
    "agent.compaction.run",
    "agent.recovery.fired",
    "agent.transcript.repaired",
    # the agent
    "agent.command",
    "agent.queue.full",
    "agent.tool_groups_killed",
    "agent.worker.dead",
    "agent.approval.answered",
    "agent.approval.resumed",
    "agent.approval.granted",
    "agent.grant.added",
    "agent.grant.revoked",
    "agent.goal.verdict",
    "agent.goal.supervisor_failed",
    "agent.goal.ended",
    "agent.delegate.started",
    "agent.delegate.finished",
    # long-term memory (docs/delegation-memory.md): a recall that found nothing, or failed
    "memory_miss",
    # channels
    "channel.event.duplicate",
    "channel.event.unparsable",
    "channel.delivery.failed",
    "channel.preview.posted",
    "channel.reply.redelivered",
    # cost (docs/cost.md): a call refused by a budget, a budget raised with /budget
    "budget.refused",
    "budget.changed",
    # cron jobs and the application
    "job.started",
    "job.skipped",
    "job.finished",
    "job.interrupted",
    # triggers (docs/triggers.md): a delivery taken in, a thread opened for a key
    "trigger.delivery",
    "trigger.thread.opened",
    "config.reloaded",
    # leased singletons across workers (docs/scale-out.md)
    "lease.taken",
    "lease.lost",
    "lease.released",
]
"""Every observability event name (docs/operations.md#events), in one place: emitters are
type-checked
against it, so a typo or a new event without an entry here fails `mypy`."""


@record(frozen=True, slots=True)
class Observed:
    """A structured observability event (docs/operations.md#events), e.g. `agent.tool.retry`."""

    name: EventName
    data: dict[str, Any] = field(default_factory=dict)
    kind: Literal["observed"] = "observed"


@record(frozen=True, slots=True)
class TokensEstimated:
    """The provider sent no usage for the call that just finished (Ollama-style servers):
    the loop counted the tokens itself. Every ledger adds this as it adds a real usage."""

    usage: Usage
    kind: Literal["tokens_estimated"] = "tokens_estimated"


@record(frozen=True, slots=True)
class CompactionProgress:
    """A hard compaction (recovery stage R1 or R2, docs/context.md#compaction-progress):
    sent as it starts (`after` is None) and once it is done. Channels show it as a
    transient status and remove it when the run goes on."""

    stage: str
    before: int
    after: int | None = None
    kind: Literal["compaction_progress"] = "compaction_progress"

    @property
    def line(self) -> str:
        """The status as people read it: "Compacting: 120k → 40k tokens"."""
        if self.after is None:
            return f"Compacting: {_k(self.before)} tokens…"
        return f"Compacting: {_k(self.before)} → {_k(self.after)} tokens"


def _k(tokens: int) -> str:
    return f"{tokens / 1000:.0f}k" if tokens >= 1000 else str(tokens)


LoopEvent = (
    StreamEvent
    | LLMCallStarted
    | ToolStarted
    | ToolFinished
    | Notice
    | Observed
    | TokensEstimated
    | CompactionProgress
)

EventSink = Callable[[LoopEvent], None]


def discard(_event: LoopEvent) -> None:
    """An event sink that ignores everything."""
