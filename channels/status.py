"""The one status line a streamed preview shows under the answer while the run works
(docs/channels.md#answering): the tool running, a compaction, a warning such as "no LLM
provider is available; waiting" (docs/providers.md#failover). Telegram's drafts and
Discord's previews show it; it is never part of the final answer."""

from __future__ import annotations

from core.events import (
    CompactionProgress,
    LLMCallStarted,
    LoopEvent,
    Notice,
    ToolFinished,
    ToolStarted,
)


def status_line(event: LoopEvent) -> str | None:
    """The status line for `event`: "" removes it, None leaves it as it is."""
    match event:
        case ToolStarted(call=call):
            return f"⚙️ running `{call.name}`…"
        case CompactionProgress() as progress:
            return f"🗜 {progress.line}"
        case Notice(text=text, level="warning"):
            return f"⏳ {text}"
        case ToolFinished() | LLMCallStarted():
            return ""
        case _:
            return None


def with_status(text: str, status: str) -> str:
    """`text` with the status line under it (or the status alone)."""
    if not status:
        return text
    return f"{text}\n\n{status}" if text.strip() else status
