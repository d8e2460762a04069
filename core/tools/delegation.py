"""What the `delegate` tool hands to the run that may delegate, and what it gets back
(docs/delegation-memory.md). Plain values and one protocol, so that the tool contract
(`ToolContext`) and
`RunContext` can name the seam without importing the agent that implements it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from core.records import record


@record(frozen=True, slots=True)
class ChildTask:
    """One child run to start: its instruction, the tools it may use (None: all the
    parent may give) and its iteration budget (None: the parent's)."""

    instruction: str
    tools: tuple[str, ...] | None = None
    max_iterations: int | None = None


@record(frozen=True, slots=True)
class ChildOutcome:
    """How one child run ended, as the parent sees it.

    Attributes:
        run_id: the child's durable run.
        state: its final state (`completed`, `failed`, `cancelled`, …).
        text: its final answer, or what stopped it.
        artifacts: files it left (full outputs of cut tool results, journal artifacts).
        iterations: LLM calls it made.
        replayed: it had finished before a crash: taken from the store, not run again.
    """

    run_id: str
    state: str
    text: str
    artifacts: tuple[str, ...] = ()
    iterations: int = 0
    replayed: bool = False


class Delegator(Protocol):
    """Starts the child runs of one run; bound to that run (its lane, policy, budget)."""

    @property
    def depth(self) -> int:
        """0 for a top-level run, 1 for its children, …"""

    async def delegate(self, call_id: str, tasks: Sequence[ChildTask]) -> list[ChildOutcome]:
        """Run `tasks` as child runs in parallel and return their outcomes, in order.

        Raises:
            ToolValidationError: a task asks for a tool the parent cannot give.
        """


__all__ = ["ChildOutcome", "ChildTask", "Delegator"]
