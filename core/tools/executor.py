"""Runs one tool call: validate → policy → approval → run under a timeout, with retries.

Every failure becomes an error result for the model (error-as-content); only
cancellation propagates.

Retries (docs/durability.md): a transient failure — the tool raises `ToolTransientError`, or the
executor's own timeout fires — of an idempotent call is retried after 0.5 s, 2 s and
8 s: the first try plus up to 3 retries, so at most 4 runs in all. A longer
`retry_after` from the tool replaces the backoff delay; one over `MAX_RETRY_AFTER`
is not waited for at all. Side-effecting calls run once. Validation and policy
errors are never retried, and cancellation (also during a backoff sleep) propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import field, replace

from pydantic import BaseModel

from core.clock import Clock, SystemClock
from core.errors import ToolDenied, ToolError, ToolTimeout, ToolTransientError
from core.events import Observed
from core.messages import Message, ToolCall
from core.records import record
from core.run_context import DETACHED, RunContext
from core.sandbox import site_for
from core.tools.base import (
    CallApprover,
    Category,
    RoleGate,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from core.tools.policy import ToolPolicy
from core.tools.search import offers

RETRY_DELAYS: tuple[float, ...] = (0.5, 2.0, 8.0)
"""Backoff before retry 1, 2 and 3; the call runs at most `len(RETRY_DELAYS) + 1` times."""

MAX_RETRY_AFTER = 60.0
"""A service asking us to wait longer than this is reported to the model instead: a run
should not sit idle for minutes on one lookup."""


@record(frozen=True, slots=True)
class PreparedCall:
    """A tool call looked up and validated once. A call that cannot run (unknown tool,
    invalid arguments) carries its `error` and counts as `read`: it runs nothing."""

    call: ToolCall
    category: Category
    tool: Tool | None = None
    args: BaseModel | None = None
    error: str | None = None

    @property
    def idempotent(self) -> bool:
        """Safe to run again. A call escalated above its tool's category (bash `rm -rf`)
        has side effects even if the tool is usually safe to repeat; a call that cannot
        run does nothing."""
        tool = self.tool
        return tool is None or (tool.idempotent and self.category == tool.category)


@record(slots=True)
class ToolExecutor:
    """Executes tool calls; shared by the runs of a conversation, which pass their own
    `RunContext` to every call (its events, envelope, approver and scratch dir).

    Attributes:
        ctx: what every call's tool may use (sandbox settings, the jail, extras); each
            call's tool gets it with the run's own scratch dir, cwd, env and site (its
            workspace, scratch and artifacts: core/sandbox/site.py) added.
        clock: sleeps between retries (a fake one in tests).
    """

    registry: ToolRegistry
    policy: ToolPolicy
    ctx: ToolContext
    clock: Clock = field(default_factory=SystemClock)
    redact: Callable[[str], str] | None = None  # secrets out of tool output (docs/tools.md)

    def prepare(self, call: ToolCall, role: RoleGate | None = None) -> PreparedCall:
        """Look `call` up and validate it; an unknown tool's error lists the tools a run
        of `role` is offered."""
        tool = self.registry.get(call.name)
        if tool is None and (refusal := self.registry.refused.get(call.name)) is not None:
            return PreparedCall(call, "read", error=f"error: policy: {refusal}")
        if tool is None and (why := self.registry.unavailable(call.name)) is not None:
            return PreparedCall(call, "read", error=f"error: {why}")  # e.g. its server is down
        if tool is None:
            offered = (t.name for t in self.registry.tools() if offers(role, t))
            known = ", ".join(offered) or "none"
            return PreparedCall(
                call, "read", error=f"unknown tool `{call.name}`; available: {known}"
            )
        try:
            args = tool.validate(call.arguments)
        except ToolError as exc:
            return PreparedCall(call, "read", tool, error=f"error: {exc}")
        return PreparedCall(call, tool.effective_category(args), tool, args)

    async def execute(self, call: ToolCall | PreparedCall, run: RunContext = DETACHED) -> Message:
        """Run the call for `run` and return its tool-result message."""
        prepared = call if isinstance(call, PreparedCall) else self.prepare(call, run.role)
        envelope = run.envelope
        if envelope is not None and (stored := await envelope.replay(prepared.call)) is not None:
            return stored
        checked = await self._authorized(prepared, run)  # may wait for an approver
        if envelope is not None:
            # A refused call runs nothing: like an idempotent one, it needs no durable start.
            # A resumable tool picks up from its own record when run again after a crash.
            resumable = prepared.tool is not None and prepared.tool.resumable
            idempotent = prepared.idempotent or resumable or isinstance(checked, ToolResult)
            if (stored := await envelope.begin(prepared.call, idempotent)) is not None:
                return stored
        if isinstance(checked, ToolResult):
            result = checked
        else:
            result = await self._execute(*checked, prepared, run)
        text = self.redact(result.text) if self.redact is not None else result.text
        message = Message.tool_result(
            prepared.call,
            text,
            is_error=result.is_error,
            artifacts=tuple(str(path) for path in result.artifacts),
        )
        if envelope is not None:
            await envelope.end(prepared.call, message)
        return message

    async def _authorized(
        self, prepared: PreparedCall, run: RunContext
    ) -> tuple[Tool, BaseModel] | ToolResult:
        """The tool and arguments to run, or why the call must not run (invalid, or refused
        by policy or an approver) as its error result."""
        tool, args = prepared.tool, prepared.args
        if prepared.error is not None or tool is None or args is None:
            if prepared.error is not None and prepared.error.startswith("error: policy:"):
                _refused(run, prepared, "policy", prepared.error.removeprefix("error: "))
            return ToolResult(prepared.error or "error: not runnable", is_error=True)
        if run.role is not None and (refusal := _role_refusal(run.role, tool, prepared.category)):
            # the person's role first: the run's own policy cannot widen it
            _refused(run, prepared, "role", refusal)
            return ToolResult(f"error: {refusal}", is_error=True)
        try:
            await self._authorize(tool, prepared, run)
        except ToolDenied as exc:
            if str(exc).startswith("policy:"):  # an approver's "no" is audited as such
                _refused(run, prepared, "policy", str(exc))
            return ToolResult(f"error: {exc}", is_error=True)
        except ToolError as exc:
            return ToolResult(f"error: {exc}", is_error=True)
        return tool, args

    async def _execute(
        self, tool: Tool, args: BaseModel, prepared: PreparedCall, run: RunContext
    ) -> ToolResult:
        """Run an authorised call, retrying transient failures of idempotent ones."""
        call = prepared.call
        tool_ctx = self.ctx
        per_run = run.scratch, run.cwd, run.delegator, run.asker, run.site, run.search
        if run.env or run.conv or any(thing is not None for thing in per_run):
            tool_ctx = replace(
                tool_ctx,
                scratch=run.scratch,
                cwd=run.cwd,
                env=run.env,
                call_id=call.id,
                delegator=run.delegator,
                asker=run.asker,
                # Where the run's tools work: its conversation's workspace and artifacts.
                site=run.site or site_for(tool_ctx.sandbox, run.conv, run.scratch),
                search=run.search,
            )
        retryable = prepared.idempotent
        attempt = 1
        failure: ToolError
        while True:
            try:
                return await self._run_once(tool, args, call, tool_ctx)
            except ToolTransientError as exc:
                failure, retry_after = exc, exc.retry_after
            except TimeoutError:
                failure, retry_after = ToolTimeout(f"`{call.name}` timed out"), None
            delay = self._retry_delay(attempt, retry_after) if retryable else None
            if delay is None:
                return _give_up(failure, call.name, attempt, retryable, retry_after)
            run.sink(
                Observed(
                    "agent.tool.retry",
                    {
                        "tool": call.name,
                        "call_id": call.id,
                        "attempt": attempt,
                        "delay": delay,
                        "error": str(failure),
                    },
                )
            )
            await self.clock.sleep(delay)  # a cancel here propagates like any other
            attempt += 1

    async def _authorize(self, tool: Tool, prepared: PreparedCall, run: RunContext) -> None:
        """Raise `ToolDenied` unless policy (and, if asked, the approver) allows the call."""
        call, approver = prepared.call, run.approver
        decision = self.policy.decide(tool.name, prepared.category)
        if decision.verdict == "deny":
            raise ToolDenied(f"policy: {decision.reason}")
        if decision.verdict == "ask":
            summary = f"{call.name} {call.arguments}"
            if approver is None:
                allowed = False
            elif isinstance(approver, CallApprover):
                # A call escalated above its tool's category (a destructive `bash`
                # command) is asked about every time: no durable grant covers it.
                grantable = prepared.category == tool.category
                allowed = await approver.approve_call(
                    call, summary, decision.reason, grantable=grantable
                )
            else:
                allowed = await approver(call.name, summary, decision.reason)
            if not allowed:
                raise ToolDenied(f"not approved: {decision.reason}; the approver said no")

    async def _run_once(
        self, tool: Tool, args: BaseModel, call: ToolCall, ctx: ToolContext
    ) -> ToolResult:
        """One run. Transient failures and `TimeoutError` escape for the retry loop; every
        other failure becomes an error result."""
        try:
            timeout = tool.call_timeout(args, ctx.sandbox)
            # A second wall behind the subprocess runner's own process-group timeout.
            async with asyncio.timeout(timeout + 5):
                return await tool.run(args, ctx)
        except (ToolTransientError, TimeoutError, asyncio.CancelledError):
            raise
        except ToolError as exc:
            return ToolResult(f"error: {exc}", is_error=True)
        except Exception as exc:  # error-as-content: a tool bug must not end the run
            return ToolResult(f"error: `{call.name}` failed: {type(exc).__name__}: {exc}", True)

    @staticmethod
    def _retry_delay(attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next run after failed run `attempt`; None: give up."""
        if attempt > len(RETRY_DELAYS):
            return None
        if retry_after is not None and retry_after > MAX_RETRY_AFTER:
            return None
        return max(RETRY_DELAYS[attempt - 1], retry_after or 0.0)


def _role_refusal(role: RoleGate, tool: Tool, category: Category) -> str | None:
    """Why `role` may not make this call of `tool` (`category`: the call's own), or None.
    The tool's own category counts too: a tool the role is not offered
    (`core.tools.search.offers`) stays refused whatever one call's category."""
    return role.tool_refusal(tool.name, category) or role.tool_refusal(tool.name, tool.category)


def _refused(run: RunContext, prepared: PreparedCall, by: str, reason: str) -> None:
    """Record a call refused by policy or by role in the audit log."""
    if run.audit is None:
        return
    asker = run.asker
    actor = f"{asker.channel}:{asker.user_id}" if asker is not None and asker.user_id else ""
    detail = {
        "tool": prepared.call.name,
        "category": prepared.category,
        "arguments": prepared.call.arguments,
        "by": by,
        "reason": reason,
        "run": run.run_id,
    }
    if run.role is not None:
        detail["roles"] = run.role.names
    run.audit.record("tool.refused", actor or run.kind, detail, conv=run.conv)


def _give_up(
    failure: ToolError, name: str, attempts: int, retryable: bool, retry_after: float | None
) -> ToolResult:
    """The error result after the last run: says why no (further) retry happened."""
    if not retryable:
        why = (
            f"not retried: {name} has side effects; check whether it took effect "
            "before calling it again"
        )
    elif retry_after is not None and retry_after > MAX_RETRY_AFTER:
        why = f"the service asked to wait {retry_after:g} s; not retried"
    else:
        why = f"tried {attempts} time{'s' if attempts > 1 else ''}; giving up"
    return ToolResult(f"error: {failure} ({why})", is_error=True)
