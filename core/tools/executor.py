"""Runs one tool call: validate → policy → approval → run under a timeout.

Every failure becomes an error result for the model (error-as-content); only
cancellation propagates.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import BaseModel

from core.errors import ToolDenied, ToolError, ToolTimeout
from core.messages import Message, ToolCall
from core.tools.base import Category, Tool, ToolContext, ToolRegistry, ToolResult
from core.tools.policy import ToolPolicy


@dataclass(frozen=True, slots=True)
class PreparedCall:
    """A tool call looked up and validated once. A call that cannot run (unknown tool,
    invalid arguments) carries its `error` and counts as `read`: it runs nothing."""

    call: ToolCall
    category: Category
    tool: Tool | None = None
    args: BaseModel | None = None
    error: str | None = None


@dataclass(slots=True)
class ToolExecutor:
    """Executes tool calls for one run."""

    registry: ToolRegistry
    policy: ToolPolicy
    ctx: ToolContext

    def prepare(self, call: ToolCall) -> PreparedCall:
        tool = self.registry.get(call.name)
        if tool is None:
            known = ", ".join(self.registry.names()) or "none"
            return PreparedCall(
                call, "read", error=f"unknown tool `{call.name}`; available: {known}"
            )
        try:
            args = tool.validate(call.arguments)
        except ToolError as exc:
            return PreparedCall(call, "read", tool, error=f"error: {exc}")
        return PreparedCall(call, tool.effective_category(args), tool, args)

    async def execute(self, call: ToolCall | PreparedCall) -> Message:
        """Run the call and return its tool-result message."""
        prepared = call if isinstance(call, PreparedCall) else self.prepare(call)
        result = await self._execute(prepared)
        return Message.tool_result(prepared.call, result.text, is_error=result.is_error)

    async def _execute(self, prepared: PreparedCall) -> ToolResult:
        tool, args, call = prepared.tool, prepared.args, prepared.call
        if prepared.error is not None or tool is None or args is None:
            return ToolResult(prepared.error or "error: not runnable", is_error=True)
        try:
            decision = self.policy.decide(tool.name, prepared.category)
            if decision.verdict == "deny":
                raise ToolDenied(f"policy: {decision.reason}")
            if decision.verdict == "ask":
                approver = self.policy.approver
                summary = f"{call.name} {call.arguments}"
                if approver is None or not await approver(call.name, summary, decision.reason):
                    raise ToolDenied(f"not approved: {decision.reason}; the approver said no")
            timeout = tool.call_timeout(args, self.ctx.sandbox)
            # A second wall behind the subprocess runner's own process-group timeout.
            async with asyncio.timeout(timeout + 5):
                return await tool.run(args, self.ctx)
        except ToolError as exc:
            return ToolResult(f"error: {exc}", is_error=True)
        except TimeoutError:
            return ToolResult(f"error: {ToolTimeout(f'`{call.name}` timed out')}", True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # error-as-content: a tool bug must not end the run
            return ToolResult(f"error: `{call.name}` failed: {type(exc).__name__}: {exc}", True)
