"""The Focus strategy's two tools (docs/context.md#the-focus-strategy), offered only under
`[context] strategy = "focus"`. They only acknowledge: the conversation's `FocusTracker`
reads the calls from the transcript before the next LLM call and does the work there."""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.context.focus import COMPLETE, PENDING, START
from core.tools.base import Category, Tool, ToolContext, ToolResult


class _Start(BaseModel):
    scope: str = Field(min_length=1, max_length=200, description="What you are about to explore.")


class _Complete(BaseModel):
    summary: str = Field(
        min_length=1,
        description="What the exploration found: facts, paths, numbers, decisions, open "
        "questions. It replaces the exploration's messages.",
    )


class StartFocus(Tool):
    name = START
    description = (
        "Start a focused exploration (reading files, searching, trying things). When done, "
        "call complete_focus: the exploration's messages are then replaced by your summary."
    )
    category: Category = "read"  # the conversation's own context, like the run journal
    params = _Start

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _Start)
        return ToolResult(
            f"Focus started: {args.scope}. Explore; then call complete_focus with what you found."
        )


class CompleteFocus(Tool):
    name = COMPLETE
    description = (
        "End the focused exploration started by start_focus: its messages are removed and "
        "`summary` is kept in the Knowledge block at the top of the conversation."
    )
    category: Category = "read"
    params = _Complete

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult(f"{PENDING}; it is applied before the next step.")


def focus_tools() -> list[Tool]:
    return [StartFocus(), CompleteFocus()]
