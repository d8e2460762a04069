"""Rows and histories the conformance tests store."""

from __future__ import annotations

from core.messages import Message, ToolCall
from core.store import ApprovalRow, Checkpoint, GoalRow

CONV = "test:c1:"
OTHER = "test:c2:"


def checkpoint(run_id: str, seq: int, kind: str = "llm") -> Checkpoint:
    """A checkpoint whose every field follows from `seq` (so two are told apart)."""
    return Checkpoint(run_id, seq, kind, seq, seq, seq + 1, "hash", (f"call_{seq}",), 1.0 * seq)


def approval(
    approval_id: str, *, run_id: str = "r1", call_id: str = "c1", at: float = 1.0
) -> ApprovalRow:
    """A request as a run asks it; its `state` is ignored (a request starts pending)."""
    return ApprovalRow(
        id=approval_id,
        conv=CONV,
        run_id=run_id,
        call_id=call_id,
        tool="bash",
        summary="rm -rf build/",
        reason="writes outside the workspace",
        state="ignored: a request starts pending",
        requested_at=at,
        deadline=at + 60,
        prompt=None,
        answer=None,
        answered_by=None,
    )


def goal(text: str = "ship it", *, turns: int = 0) -> GoalRow:
    """A goal; its `conv` is ignored (`save_goal` is told the conversation)."""
    return GoalRow("ignored", text, "active", True, 10, turns, "a note")


def history() -> list[Message]:
    """Every kind of message, in several scripts and with emoji."""
    call = ToolCall(id="call_0", name="read_file", arguments='{"path": "naïve.md"}')
    return [
        Message.system("Du bist hilfsbereit. 你好"),
        Message.user("Zeig mir naïve.md 📄"),
        Message.assistant("", tool_calls=(call,)),
        Message.tool_result(call, "« contenu » — ok", is_error=False),
        Message.assistant("Fertig ✓\nzweite Zeile"),
    ]


def dumped(messages: list[Message]) -> list[dict[str, object]]:
    """Messages as plain values (their cached token counts are not compared)."""
    return [m.to_dict() for m in messages]
