"""The run journal's three tools: the model reads and edits its own notes on a long task
(see `core.agent.journal`); each edit is saved with the next checkpoint."""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.agent.journal import LIST_FIELDS, MAX_ITEMS, JournalBox, ListField
from core.tools.base import Category, Tool, ToolContext, ToolResult


class _Empty(BaseModel):
    pass


class _Update(BaseModel):
    objective: str | None = Field(None, max_length=1000)
    current_state: str | None = Field(None, max_length=2000)
    handoff_next_action: str | None = Field(None, max_length=1000)
    verified_findings: list[str] | None = Field(None, description="Replaces the whole list.")
    decisions: list[str] | None = None
    artifacts: list[str] | None = None
    open_questions: list[str] | None = None
    blockers: list[str] | None = None


class _Append(BaseModel):
    field: ListField = Field(description="Which list to add to.")
    entry: str = Field(min_length=1, max_length=2000)


def _box(ctx: ToolContext) -> JournalBox:
    if ctx.journal is None:
        raise RuntimeError("no run journal in this session")
    return ctx.journal


class GetRunJournal(Tool):
    name = "get_run_journal"
    description = "Read this conversation's run journal (objective, state, findings, …)."
    category: Category = "read"
    params = _Empty

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult(_box(ctx).journal.model_dump_json(indent=1))


class UpdateRunJournal(Tool):
    name = "update_run_journal"
    description = (
        "Set journal fields (lists are replaced whole). Keep it current on long tasks; it "
        "survives compaction."
    )
    # The journal is the bot's own memory, not an outside side effect: it is allowed
    # wherever read tools are, including cron jobs.
    category: Category = "read"
    params = _Update

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _Update)
        box = _box(ctx)
        changes = args.model_dump(exclude_none=True)
        for name in LIST_FIELDS:
            if name in changes:
                changes[name] = changes[name][-MAX_ITEMS:]
        box.replace(box.journal.model_copy(update=changes))
        return ToolResult(f"journal updated: {', '.join(changes) or 'nothing changed'}")


class AppendRunJournalEntry(Tool):
    name = "append_run_journal_entry"
    description = (
        "Add one entry to a journal list: verified_findings, decisions, artifacts, "
        "open_questions or blockers."
    )
    category: Category = "read"
    params = _Append

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _Append)
        box = _box(ctx)
        items = [*getattr(box.journal, args.field), args.entry][-MAX_ITEMS:]
        box.replace(box.journal.model_copy(update={args.field: items}))
        return ToolResult(f"added to {args.field} ({len(items)} entries)")


def journal_tools() -> list[Tool]:
    return [GetRunJournal(), UpdateRunJournal(), AppendRunJournalEntry()]
