"""Runs one tool call: validate → policy → approval → run under a timeout.

Every failure becomes an error result for the model (error-as-content); only
cancellation propagates.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from core.errors import ToolDenied, ToolError, ToolTimeout
from core.messages import Message, ToolCall
from core.tools.base import Category, ToolContext, ToolRegistry, ToolResult
from core.tools.policy import ToolPolicy


@dataclass(slots=True)
class ToolExecutor:
    """Executes tool calls for one run."""

    registry: ToolRegistry
    policy: ToolPolicy
    ctx: ToolContext

    def category_of(self, call: ToolCall) -> Category:
        """The call's effective category; unknown or invalid calls count as `read` (they
        run nothing)."""
        tool = self.registry.get(call.name)
        if tool is None:
            return "read"
        try:
            return tool.effective_category(tool.validate(call.arguments))
        except ToolError:
            return "read"

    async def execute(self, call: ToolCall) -> Message:
        """Run `call` and return its tool-result message."""
        result = await self._execute(call)
        return Message.tool_result(call, result.text, is_error=result.is_error)

    async def _execute(self, call: ToolCall) -> ToolResult:
        tool = self.registry.get(call.name)
        if tool is None:
            known = ", ".join(self.registry.names()) or "none"
            return ToolResult(f"unknown tool `{call.name}`; available tools: {known}", True)
        try:
            args = tool.validate(call.arguments)
            category = tool.effective_category(args)
            decision = self.policy.decide(tool.name, category)
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
