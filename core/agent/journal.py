"""The run journal (docs/durability.md): the model's structured notes on a long task, per
conversation.

A ~500-char digest goes into the system prompt every turn and the full journal sits after
any history summary, so a compaction never loses where the work stands. The model edits it
with three tools; each edit is saved with the next checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

DIGEST_CHARS = 500
ListField = Literal["verified_findings", "decisions", "artifacts", "open_questions", "blockers"]
LIST_FIELDS: tuple[ListField, ...] = get_args(ListField)
MAX_ITEMS = 50


class RunJournal(BaseModel):
    """What a run keeps of its work (docs/context.md). Frozen, and changed only by
    replacing it (`model_copy(update=...)` with new lists): every conversation without a
    journal shares `EMPTY_JOURNAL`, and none may change it under the others."""

    model_config = ConfigDict(frozen=True)

    objective: str = ""
    current_state: str = ""
    verified_findings: list[str] = Field(default=[])
    decisions: list[str] = Field(default=[])
    artifacts: list[str] = Field(default=[])
    open_questions: list[str] = Field(default=[])
    blockers: list[str] = Field(default=[])
    handoff_next_action: str = ""

    def is_empty(self) -> bool:
        return self is EMPTY_JOURNAL or self == EMPTY_JOURNAL

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


EMPTY_JOURNAL = RunJournal()


def journal_of(data: dict[str, Any] | None) -> RunJournal:
    """The journal the store kept (`EMPTY_JOURNAL`, shared, for none or an empty one)."""
    journal = RunJournal.model_validate(data) if data else EMPTY_JOURNAL
    return EMPTY_JOURNAL if journal.is_empty() else journal


JournalSaver = Callable[[RunJournal], None]


class JournalBox:
    """One conversation's journal and how to persist it (its tools find it in
    `ToolContext.journal`)."""

    def __init__(self, journal: RunJournal | None = None, save: JournalSaver | None = None):
        self.journal = journal or EMPTY_JOURNAL
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
        return cls(journal_of(data), save)
