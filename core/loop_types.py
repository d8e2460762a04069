"""The tool loop's data (docs/loop.md): what a caller gives `core.loop.run_loop`
(`LoopConfig`, `Guards` with a `ContextGuard`), what it gets back (`LoopOutcome`, with its
`StopReason`), and what one run carries between its steps (`LoopRun`, which the tool
phase in `core.loop_tools` works on too). All importable from `core.loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, Protocol

from core.context.tokens import TokenCounter
from core.events import EventSink
from core.messages import Message
from core.providers.base import Provider
from core.records import record
from core.resilience import LoopDetector, TimeLimits
from core.run_context import RunContext
from core.tools.base import ToolSpec
from core.tools.executor import ToolExecutor
from core.tools.search import ToolSearch, offered_specs

if TYPE_CHECKING:
    from core.context.manager import CompactionReport

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
class LoopRun:
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
