"""What one run carries down the call chain (docs/loop.md#what-one-run-carries).

A `RunContext` is built once when a run starts and never changed while it runs: the loop,
the tool executor and every tool receive it as an argument. Conversations, executors and
guards are shared by the runs of a conversation, so nothing about one run is ever stored on
them: events, tool records and approvals cannot land in another run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from core.chat import Asker
from core.events import EventSink, discard
from core.messages import Message, ToolCall
from core.records import record
from core.sandbox import ToolSite
from core.tools.base import Approver, RoleGate, ToolFinder

if TYPE_CHECKING:
    from core.cost.meter import Reservation
    from core.events import Usage
    from core.tools.delegation import Delegator

RunKind = Literal["chat", "cron", "goal", "child"]
"""Who started the run: a person in a chat, a cron job, a goal driver, a parent run."""


class Recorder(Protocol):
    """Told of every safe boundary of a run (docs/durability.md checkpoints)."""

    def checkpoint(self, kind: str, iteration: int, messages: list[Message]) -> None: ...


class Envelope(Protocol):
    """The idempotency envelope (docs/durability.md): every call is recorded as started before it
    runs
    and as completed with its result after; a completed call is replayed, not re-run.

    A call is recorded as started only once it is authorised: one still waiting on an
    approver (or refused) has run nothing, so a resumed run may safely ask again."""

    async def replay(self, call: ToolCall) -> Message | None:
        """The stored result if this call already completed (in a resumed run)."""

    async def begin(self, call: ToolCall, idempotent: bool) -> Message | None:
        """Record the start; return the stored result if this call already completed."""

    async def end(self, call: ToolCall, result: Message) -> None: ...


class Meter(Protocol):
    """Prices a run's LLM calls and holds them to the budgets (docs/cost.md;
    `core.cost.meter.RunMeter`)."""

    async def reserve(
        self, kind: str, model: str, prompt_tokens: int | Callable[[], int], max_output: int
    ) -> Reservation:
        """Hold the call's worst case (the prompt counted by `prompt_tokens()` only when a
        budget applies); raises `BudgetExceeded` if a budget refuses it."""
        ...

    def settle(
        self, reservation: Reservation, provider: str, kind: str, model: str, usage: Usage | None
    ) -> float | None:
        """Record the call (`usage` None: it failed) and free what it did not cost."""
        ...


_NO_ENV: Mapping[str, str] = MappingProxyType({})


class Auditor(Protocol):
    """The audit log (`core.audit.AuditLog`): `record` appends in the background."""

    def record(
        self, kind: str, actor: str, detail: dict[str, Any] | None = None, *, conv: str = ""
    ) -> None: ...


@record(frozen=True, slots=True)
class RunContext:
    """One run's own things, frozen.

    Attributes:
        run_id: the durable run's id ("" for a run outside the store: the CLI, a test).
        conv: the conversation id the run belongs to.
        kind: what started the run (see `RunKind`).
        sink: receives every event of the run.
        recorder: checkpoints at the run's safe boundaries (None: not durable).
        envelope: records tool calls around their execution (None: not durable).
        approver: asked before a call that policy says needs a human; None denies those.
        deadline: the clock's monotonic time by which the run must end, on top of the
            conversation's own time limits (a child run inside its parent's budget).
        scratch: the run's own temp dir, tools' HOME and TMPDIR (None: one per call).
        cwd: the directory tools start in (None: the workspace).
        env: variables added to tools' environment for this run.
        parent_run_id: the run that delegated this one (a child run), else None.
        delegator: starts this run's child runs (`delegate`); None where it may not.
        asker: who the run answers and where (None: nobody, e.g. a one-off call); tools
            that keep per-person state scope by it.
        site: where the run's tools work: its workspace (per `workspace_scope`), scratch
            and conversation's artifacts (None: derived from `conv` and `scratch`).
        search: the run's tool search, when it has more tools than it offers at once
            (set by the loop; core/tools/search.py).
        role: what the person the run answers may use (docs/governance.md#roles): the
            tools it refuses are neither offered to the model nor run; None: no role
            limits the run (a cron job: its `allow_tools` do).
        audit: where refusals are recorded (docs/governance.md#the-audit-log); None:
            nowhere.
        meter: prices the run's LLM calls and holds them to the budgets (None: neither).
    """

    run_id: str = ""
    conv: str = ""
    kind: RunKind = "chat"
    sink: EventSink = discard
    recorder: Recorder | None = None
    envelope: Envelope | None = None
    approver: Approver | None = None
    deadline: float | None = None
    scratch: Path | None = None
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=lambda: _NO_ENV)
    parent_run_id: str | None = None
    delegator: Delegator | None = None
    asker: Asker | None = None
    site: ToolSite | None = None
    search: ToolFinder | None = None
    role: RoleGate | None = None
    audit: Auditor | None = None
    meter: Meter | None = None


DETACHED = RunContext()
"""A run with no store, no approver and no events: one-off calls (benchmarks, tests)."""

__all__ = ["DETACHED", "Auditor", "Envelope", "Meter", "Recorder", "RunContext", "RunKind"]
