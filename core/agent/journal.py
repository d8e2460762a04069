"""The run journal (docs/durability.md): the model's structured notes on a long task, per
conversation.

A ~500-char digest goes into the system prompt every turn and the full journal sits after
any history summary, so a compaction never loses where the work stands. The model edits it
with three tools; each edit is saved with the next checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from core.tools.base import Category, Tool, ToolContext, ToolResult

DIGEST_CHARS = 500
ListField = Literal["verified_findings", "decisions", "artifacts", "open_questions", "blockers"]
LIST_FIELDS: tuple[ListField, ...] = get_args(ListField)
MAX_ITEMS = 50


class RunJournal(BaseModel):
    objective: str = ""
    current_state: str = ""
    verified_findings: list[str] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)
    open_questions: list[str] = Field(default_factory=list)
    blockers: list[str] = Field(default_factory=list)
    handoff_next_action: str = ""

    def is_empty(self) -> bool:
        return self == RunJournal()

    def render(self) -> str:
        """The whole journal as Markdown (the `/journal` command, after a summary)."""
        if self.is_empty():
            return "The run journal is empty."
        lines = ["Run journal"]
        for name in ("objective", "current_state"):
            if value := getattr(self, name):
                lines.append(f"- {name.replace('_', ' ')}: {value}")
        for name in LIST_FIELDS:
            items: list[str] = getattr(self, name)
            if items:
                lines.append(f"- {name.replace('_', ' ')}:")
                lines.extend(f"  - {item}" for item in items)
        if self.handoff_next_action:
            lines.append(f"- next action: {self.handoff_next_action}")
        return "\n".join(lines)

    def digest(self, limit: int = DIGEST_CHARS) -> str:
        """About `limit` characters: objective, state, next action, then the latest items."""
        if self.is_empty():
            return ""
        parts = [
            f"{label}: {value}"
            for label, value in (
                ("Objective", self.objective),
                ("State", self.current_state),
                ("Next", self.handoff_next_action),
                ("Blockers", "; ".join(self.blockers[-2:])),
                ("Latest findings", "; ".join(self.verified_findings[-2:])),
                ("Decisions", "; ".join(self.decisions[-2:])),
            )
            if value
        ]
        text = " | ".join(parts)
        return text if len(text) <= limit else text[: limit - 1] + "…"


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


JournalSaver = Callable[[RunJournal], None]


class JournalBox:
    """One conversation's journal and how to persist it (lives in `ToolContext.extra`)."""

    def __init__(self, journal: RunJournal | None = None, save: JournalSaver | None = None):
        self.journal = journal or RunJournal()
        self._save = save

    def render_full(self) -> str:
        """The whole journal, for after a history summary; "" while it is empty."""
        return "" if self.journal.is_empty() else self.journal.render()

    def replace(self, journal: RunJournal) -> None:
        self.journal = journal
        if self._save is not None:
            self._save(journal)

    @classmethod
    def from_data(cls, data: dict[str, Any] | None, save: JournalSaver | None) -> JournalBox:
        return cls(RunJournal.model_validate(data) if data else None, save)


def _box(ctx: ToolContext) -> JournalBox:
    box = ctx.extra.get("journal")
    if not isinstance(box, JournalBox):
        raise RuntimeError("no run journal in this session")
    return box


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
