"""The `remember` (write) and `recall` (read) tools. Each run's tools know who asks and
where (`ToolContext.asker`), and the scopes follow from that (`scopes.py`): the model
picks a scope kind, never a scope id, so it cannot reach anyone else's memory."""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.chat import Asker
from core.errors import ToolError
from core.memory.recall import quote
from core.memory.scopes import DESCRIPTIONS
from core.memory.service import Memory
from core.store import ScopeKind
from core.tools.base import Category, Tool, ToolContext, ToolResult

MAX_MEMORY_CHARS = 2000
NOTHING_FOUND = "No memories found."


class _Remember(BaseModel):
    text: str = Field(
        min_length=1,
        max_length=MAX_MEMORY_CHARS,
        description="The fact, self-contained.",
    )
    scope: ScopeKind = Field(
        "conversation",
        description="Who may recall it: this conversation, the asker (only in their DMs), "
        "this channel, or the team.",
    )


class _Recall(BaseModel):
    query: str = Field(min_length=1, max_length=2000, description="Words to look for.")
    limit: int = Field(5, ge=1, le=20)
    scope: ScopeKind | None = Field(None, description="Only this scope.")


def _where(ctx: ToolContext) -> tuple[Memory, Asker]:
    memory = ctx.memory
    if memory is None or ctx.asker is None:
        raise ToolError("long-term memory is not available in this conversation")
    return memory, ctx.asker


class RememberTool(Tool):
    name = "remember"
    description = (
        "Save a fact for later conversations: what the user asked to keep or will clearly "
        "want; never secrets."
    )
    category: Category = "write"
    params = _Remember

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _Remember)
        memory, asker = _where(ctx)
        row = await memory.remember(args.text, args.scope, asker)
        return ToolResult(f"Remembered as #{row.id} ({args.scope}: {DESCRIPTIONS[args.scope]}).")


class RecallTool(Tool):
    name = "recall"
    description = (
        "Search long-term memory by words: the best matches, quoted with their ids, scopes, "
        "authors and dates."
    )
    category: Category = "read"
    params = _Recall

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _Recall)
        memory, asker = _where(ctx)
        hits = await memory.recall(args.query, asker, args.limit, args.scope)
        if hits is None:  # what failed is in the operators' log, not the model's context
            return ToolResult("Long-term memory is unavailable right now.", is_error=True)
        if not hits:
            return ToolResult(NOTHING_FOUND)
        return ToolResult(quote(hits, relevance=True))


def memory_tools() -> list[Tool]:
    return [RememberTool(), RecallTool()]
