"""TACO (docs/context.md#big-tool-outputs-taco): a tool output too big for the history
is compressed by the summary model, or cut, before it enters it, and its full text kept
in an artifact. `ContextManager` shrinks each result through
`ToolOutputs.process_tool_result`."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from pathlib import Path

from core.context.settings import ContextSettings
from core.context.summarize import (
    SUMMARY_PROMPT_OVERHEAD,
    TACO_PROMPT,
    ProviderSummarizer,
    Summarizer,
)
from core.context.tokens import TokenCounter
from core.context.transcript import clip
from core.messages import Message

log = logging.getLogger(__name__)

TACO_HEADER = "[compressed tool output]"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class ToolOutputs:
    """The manager's TACO part, over the manager's settings, counter and summarizer."""

    settings: ContextSettings
    counter: TokenCounter
    summarizer: Summarizer | None
    artifacts_dir: Path | None

    def _summary_input_tokens(self) -> int:
        """`summary_max_input_tokens`, or less if the summary model's window is smaller
        (the summarizer still clips what it sends: this cut drops the oldest part first)."""
        budget = self.settings.summary_max_input_tokens
        if isinstance(self.summarizer, ProviderSummarizer):
            budget = min(budget, self.summarizer.max_input_tokens)
        return budget

    async def process_tool_result(self, result: Message, *, approved: bool) -> Message:
        """TACO: shrink a big tool output before it enters the history (best effort).

        The full text goes to a file in `artifacts_dir` (if set) and the result is replaced
        by a compressed version (or its start) plus a note where the full output is.
        Results of user-approved calls are never summarised; any failure returns `result`.
        """
        if approved or result.role != "tool":
            return result
        try:
            threshold = self.settings.taco_threshold
            if self.counter.upper_bound(result) <= threshold:
                return result  # cheap check first: most outputs are small
            if self.counter.message(result) <= threshold:
                return result
            # A sandbox-capped output already has its full text in an artifact: point to
            # that one instead of writing a second file of the capped text.
            kept = result.artifacts
            path = Path(kept[0]) if kept else await self._offload(result)
            text = await self._compress(result)
            if text is None and path is None:
                return result
            if text is None:
                text = clip(result.content, self.settings.taco_target)
            else:
                text = f"{TACO_HEADER}\n{text}"
            if path is not None:
                text += f"\n[full output: {path}; read it with read_file]"
            return result.with_changes(content=text)  # no cached count or JSON
        except Exception:  # best effort: the raw output is still a correct result
            log.warning("TACO failed for %s; keeping the raw output", result.name, exc_info=True)
            return result

    async def _compress(self, result: Message) -> str | None:
        if self.summarizer is None:
            return None
        prompt = TACO_PROMPT.format(
            name=result.name or "tool",
            target=self.settings.taco_target,
            body=clip(result.content, self._summary_input_tokens() - SUMMARY_PROMPT_OVERHEAD),
        )
        try:
            text = (await self.summarizer(prompt)).strip()
        except Exception:
            log.warning("TACO summary failed for %s", result.name, exc_info=True)
            return None
        if not text or self.counter.text(text) >= self.settings.taco_threshold:
            return None  # no gain: the cut raw output serves better
        return text

    async def _offload(self, result: Message) -> Path | None:
        if self.artifacts_dir is None:
            return None
        digest = hashlib.sha256(result.content.encode()).hexdigest()[:12]
        stem = _SAFE.sub("_", result.name or "tool")[:40]
        path = self.artifacts_dir / f"{stem}-{digest}.txt"

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(result.content, encoding="utf-8")

        await asyncio.to_thread(write)  # a big output: keep the event loop free
        return path


__all__ = ["TACO_HEADER", "ToolOutputs"]
