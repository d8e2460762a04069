"""Context pressure management (docs/context.md): masking, the recovery ladder, TACO, hard limit.

`ContextManager.preflight` runs before every LLM call. Below the soft threshold it only
checks the transcript and counts tokens, both incrementally (O(new messages)). Above it:

* soft (0.60): old tool outputs outside the last `keep_tail` messages are masked;
* compact (0.70): the recovery ladder. R1 replaces the older messages with one summary
  (latest successful result per tool pinned, latest user request kept verbatim); R2 deep
  prunes to `deep_keep` messages if still over within `escalate_after_iterations` of R1;
  R3 asks the human (interactive) or stops (cron). At most `max_recoveries` per turn;
* hard (0.95): still over after all that → `ContextLimitExceeded`.

A failed or missing summarizer never stalls work: compaction falls back to a
deterministic truncation summary.

`strategy` "subgoal"/"subgoal_mig" (docs/context.md#context-strategies) keeps the active subgoal's
messages (see
`subgoals.py`; older outputs masked only if still over) and ranks the summary input
(`eviction.py`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.context.eviction import PROTECTED, ranked_render_async
from core.context.subgoals import TIER_SCORE, SubgoalTracker, block_start
from core.context.summarize import (
    SUMMARY_PROMPT,
    SUMMARY_PROMPT_OVERHEAD,
    TACO_PROMPT,
    ProviderSummarizer,
    Summarizer,
)
from core.context.tokens import TokenCounter
from core.context.transcript import (
    SUMMARY_HEADER,
    clip,
    is_summary,
    latest_user,
    pinned_results,
    render,
    repair_transcript,
    tail_start,
    truncation_summary,
    valid_from,
)
from core.context.watermark import Watermark
from core.errors import ContextLimitExceeded
from core.events import CompactionProgress, EventSink, Observed
from core.messages import Message

Pressure = Literal["ok", "ask_human", "stop"]
Strategy = Literal["summary", "subgoal", "subgoal_mig"]
Stage = Literal["R1", "R2", "R3"]

DEEP_MARKER = "(deep pruned)"
TACO_HEADER = "[compressed tool output]"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
log = logging.getLogger(__name__)


class ContextSettings(BaseModel):
    """`[context]` in config.toml: thresholds are fractions of the model's context window."""

    model_config = ConfigDict(extra="forbid")

    soft: float = Field(0.60, gt=0, le=1, description="Mask old tool outputs above this.")
    compact: float = Field(0.70, gt=0, le=1, description="Run the recovery ladder above this.")
    hard: float = Field(0.95, gt=0, le=1, description="Fail the turn above this.")
    manual_target: float = Field(0.50, gt=0, le=1, description="Target of `/compact`.")
    keep_tail: int = Field(10, ge=1, description="Messages kept verbatim by R1.")
    deep_keep: int = Field(4, ge=1, description="Messages kept verbatim by R2.")
    taco_threshold: int = Field(2000, ge=1, description="Tokens; bigger tool outputs shrink.")
    taco_target: int = Field(500, ge=1, description="Tokens a compressed output aims for.")
    max_recoveries: int = Field(4, ge=0, description="Recovery actions per user turn.")
    escalate_after_iterations: int = Field(20, ge=0, description="R1→R2→R3 window.")
    summary_max_input_tokens: int = Field(24000, ge=256, description="Summarizer input cap.")
    strategy: Strategy = Field(
        "summary", description="What compaction keeps: summary, subgoal or subgoal_mig."
    )
    mask_placeholder: str = Field(
        "[old tool output removed to save context; call the tool again if you need it]",
        min_length=1,
    )

    @model_validator(mode="after")
    def _ordered(self) -> ContextSettings:
        if not self.soft <= self.compact <= self.hard:
            raise ValueError("thresholds must satisfy soft <= compact <= hard")
        return self


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """One compaction: its kind ("mask", "R1", "R2", "manual") and token counts."""

    kind: str
    before: int
    after: int
    summary: Literal["llm", "truncation", "none"] = "none"


def _with_content(message: Message, text: str) -> Message:
    return message.model_copy(update={"content": text})  # with no cached count or JSON


class ContextManager:
    """Keeps one conversation under its model's context window (see the module doc)."""

    def __init__(
        self,
        window: int,
        counter: TokenCounter,
        summarizer: Summarizer | None,
        settings: ContextSettings | None = None,
        session: Literal["interactive", "cron"] = "interactive",
        artifacts_dir: Path | None = None,
        after_summary: Callable[[], str] | None = None,
    ) -> None:
        self.window = window
        self.counter = counter
        self.summarizer = summarizer
        self.settings = settings or ContextSettings()
        self.session = session
        self.artifacts_dir = artifacts_dir
        self.last_compaction: CompactionReport | None = None
        self.after_summary = after_summary  # text placed after a summary: the run journal
        s = self.settings
        self.soft_at, self.compact_at = int(window * s.soft), int(window * s.compact)
        self.hard_at = int(window * s.hard)
        self._counted, self._validated, self._bounded = Watermark(), Watermark(), Watermark()
        self._total = self._bound_total = 0
        # Masked results' originals by call id, so R1 can still pin what masking removed.
        self._originals: dict[str, tuple[Message, Message]] = {}
        tracking = self.settings.strategy != "summary"
        self.subgoals = SubgoalTracker(summarizer) if tracking else None
        self.start_turn()

    def subgoal_status(self) -> str | None:
        """The active subgoal for `/status`; None when the strategy tracks none."""
        if self.subgoals is None:
            return None
        return self.subgoals.active_text() or "none yet"

    async def aclose(self) -> None:
        """Cancel a subgoal extraction still in flight."""
        if self.subgoals is not None:
            await self.subgoals.aclose()

    def start_turn(self) -> None:
        """Reset the per-turn recovery counters (call at each new user turn)."""
        self.recoveries = 0
        self.iteration = 0
        self._last_stage: tuple[Stage, int] | None = None

    def tokens(self, messages: list[Message]) -> int:
        """Tokens of `messages`; after appends only the new messages are counted."""
        start = self._counted.appended_from(messages)
        if start:
            count = self.counter.message
            total = self._total + sum(count(messages[i]) for i in range(start, len(messages)))
        else:
            total = self.counter.messages(messages)
        self._total = total
        self._counted.mark(messages)
        # An exact count is also an upper bound: later bounds go on from here.
        self._bound_total = total
        self._bounded.mark(messages)
        return total

    def _upper_bound(self, messages: list[Message]) -> int:
        """At least `tokens(messages)`, cheap and incremental like it (see
        `TokenCounter.upper_bound`)."""
        start = self._bounded.appended_from(messages)
        bound = self.counter.upper_bound
        new = sum(bound(messages[i]) for i in range(start, len(messages)))
        self._bound_total = (self._bound_total if start else 0) + new
        self._bounded.mark(messages)
        return self._bound_total

    def _forget_counts(self) -> None:
        """After an in-place edit the watermarks cannot tell what changed: recount."""
        self._counted.reset()
        self._bounded.reset()

    async def preflight(self, messages: list[Message], sink: EventSink) -> Pressure:
        """Check and, if needed, shrink `messages` (in place) before an LLM call.

        Raises:
            ContextLimitExceeded: still at or over the hard limit after every recovery.
        """
        self.iteration += 1
        self._repair(messages, sink)
        # between steps, never awaited (docs/context.md#context-strategies)
        if self.subgoals is not None:
            self.subgoals.refresh(messages)
        if self._upper_bound(messages) < self.soft_at:
            return "ok"  # the exact count is lower still: no need for the tokenizer
        used = self.tokens(messages)
        if used < self.soft_at:
            return "ok"
        used = self._mask(messages, sink, used)
        if used >= self.compact_at:
            verdict, used = await self._recover(messages, sink, used)
            if verdict != "ok":
                return verdict  # no LLM call follows, so the hard limit does not matter yet
        if used >= self.hard_at:
            raise ContextLimitExceeded(used, self.hard_at)
        return "ok"

    async def compact(self, messages: list[Message], *, sink: EventSink) -> CompactionReport:
        """Manual `/compact`: summarise down to `manual_target` of the window."""
        goal = int(self.window * self.settings.manual_target)
        self._repair(messages, sink)
        before = self.tokens(messages)
        self._mask(messages, sink, before)
        report = await self._summarise(messages, self.settings.keep_tail, "manual", sink)
        if report.after > goal:
            keep = self.settings.deep_keep
            report = await self._summarise(messages, keep, "manual", sink, deep=True)
        self.last_compaction = CompactionReport("manual", before, report.after, report.summary)
        return self.last_compaction

    def _repair(self, messages: list[Message], sink: EventSink) -> None:
        if not valid_from(messages, self._validated.appended_from(messages)):
            repair = repair_transcript(messages)
            messages[:] = repair.messages
            self._forget_counts()
            if self.subgoals is not None:  # spans cannot follow a repair cheaply
                self.subgoals.registry.reset()
            data = {"synthesized": repair.synthesized, "dropped": repair.dropped}
            sink(Observed("agent.transcript.repaired", {**data, "moved": repair.moved}))
        self._validated.mark(messages)

    def _mask(self, messages: list[Message], sink: EventSink, used: int) -> int:
        """Observation masking: old tool outputs become a short placeholder."""
        placeholder = self.settings.mask_placeholder
        stop = len(messages) - self.settings.keep_tail
        if self.subgoals is not None:  # the active subgoal's outputs stay verbatim
            self.subgoals.registry.sync(messages)
            if (active := self.subgoals.registry.active_start()) is not None:
                stop = min(stop, active)
        masked = self._mask_range(messages, 0, stop, placeholder)
        if not masked:
            return used
        self._forget_counts()  # replaced in place: first/last identity cannot tell
        after = self.tokens(messages)
        self.last_compaction = CompactionReport("mask", used, after)
        data = {"kind": "mask", "before": used, "after": after, "masked": masked}
        sink(Observed("agent.compaction.run", data))
        return after

    def _mask_range(self, messages: list[Message], start: int, stop: int, placeholder: str) -> int:
        """Mask the tool outputs of `messages[start:stop]` bigger than `placeholder`."""
        smallest = self.counter.text(placeholder) + 8  # masking must save tokens
        masked = 0
        for i in range(start, stop):
            m = messages[i]
            if m.role != "tool" or m.content == placeholder or self.counter.message(m) < smallest:
                continue
            short = Message(
                role="tool",
                content=placeholder,
                tool_call_id=m.tool_call_id,
                name=m.name,
                is_error=m.is_error,
            )
            if m.tool_call_id:
                self._originals[m.tool_call_id] = (short, m)
            messages[i] = short
            masked += 1
        return masked

    def _next_stage(self) -> Stage:
        if self._last_stage is None:
            return "R1"
        stage, at = self._last_stage
        if self.iteration - at > self.settings.escalate_after_iterations:
            return "R1"
        return "R2" if stage == "R1" else "R3"

    async def _recover(
        self, messages: list[Message], sink: EventSink, used: int
    ) -> tuple[Pressure, int]:
        """Climb the recovery ladder while over `compact`, within the per-turn budget."""
        while used >= self.compact_at and self.recoveries < self.settings.max_recoveries:
            stage = self._next_stage()
            self.recoveries += 1
            self._last_stage = (stage, self.iteration)
            if stage == "R3":
                data = {"stage": stage, "before": used, "after": used, "session": self.session}
                sink(Observed("agent.recovery.fired", data))
                return ("ask_human" if self.session == "interactive" else "stop"), used
            keep = self.settings.keep_tail if stage == "R1" else self.settings.deep_keep
            sink(CompactionProgress(stage, used))  # a transient status while it runs
            report = await self._summarise(messages, keep, stage, sink, deep=stage == "R2")
            sink(CompactionProgress(stage, report.before, report.after))
            log.info(
                "compaction %s: %d → %d tokens (saved %d)",
                stage,
                report.before,
                report.after,
                report.before - report.after,
            )
            data = {"stage": stage, "before": report.before, "after": report.after}
            sink(Observed("agent.recovery.fired", data))
            used = report.after
        return "ok", used

    async def _summarise(
        self, messages: list[Message], keep: int, kind: str, sink: EventSink, deep: bool = False
    ) -> CompactionReport:
        """Replace-and-tail: system, one summary, the latest user request, the last `keep`
        (and, with a subgoal strategy, every message of the active subgoal)."""
        track = self.subgoals
        if track is None:
            return await self._replace_head(messages, keep, kind, sink, deep)
        track.registry.sync(messages)
        track.hold()  # an extraction reply arriving meanwhile must not move the spans
        try:
            report = await self._replace_head(messages, keep, kind, sink, deep)
            active = track.registry.active_start()
            # Still over (or R2): the budget forces the active span's older outputs to
            # shrink; its messages and pairs stay.
            if active is not None and (deep or report.after >= self.compact_at):
                stop = len(messages) - keep
                placeholder = self.settings.mask_placeholder
                if masked := self._mask_range(messages, active, stop, placeholder):
                    self._forget_counts()
                    data = {"kind": "mask", "before": report.after, "masked": masked}
                    after = self.tokens(messages)
                    report = CompactionReport(kind, report.before, after, report.summary)
                    sink(Observed("agent.compaction.run", {**data, "after": report.after}))
                    self.last_compaction = report
            return report
        finally:
            track.release()

    async def _replace_head(
        self, messages: list[Message], keep: int, kind: str, sink: EventSink, deep: bool
    ) -> CompactionReport:
        before = self.tokens(messages)
        system = messages[:1] if messages and messages[0].role == "system" else []
        p = len(system)
        body = messages[p:]
        cut = tail_start(body, keep)
        registry = self.subgoals.registry if self.subgoals is not None else None
        if registry is not None and (active := registry.active_start()) is not None:
            cut = min(cut, block_start(body, max(0, active - p)))  # never into the span
        if cut == 0:
            return CompactionReport(kind, before, before)
        latest = latest_user(body)
        verbatim = [body[latest]] if latest is not None and latest < cut else []
        head = [self._original(m) for i, m in enumerate(body[:cut]) if i != latest]
        if registry is not None and not head:  # all of it is the active subgoal
            return CompactionReport(kind, before, before)
        ranked = None
        if registry is not None:
            tiers = registry.tiers(len(messages))
            relevance = [
                PROTECTED if is_summary(m) else TIER_SCORE[tiers[p + i]]
                for i, m in enumerate(body[:cut])
                if i != latest
            ]
            budget = self._summary_input_tokens() - SUMMARY_PROMPT_OVERHEAD
            mig = self.settings.strategy == "subgoal_mig"
            ranked = await ranked_render_async(head, relevance, self.counter, budget, mig)
        text, source = await self._summary_text(head, deep, ranked)
        new = [*system, Message.user(text), *verbatim, *body[cut:]]
        repaired = repair_transcript(new)  # strips anything orphaned
        messages[:] = repaired.messages
        if registry is not None:
            if repaired.changed:  # cannot happen for a valid input; never guess spans
                registry.reset()
            else:  # offset arithmetic: the head went, the summary (+ request) came
                registry.rebuild_after_compaction(p, p + cut, 1 + len(verbatim))
            registry.adopt(messages)
        self._originals.clear()
        self._forget_counts()
        self._validated.mark(messages)
        report = CompactionReport(kind, before, self.tokens(messages), source)
        self.last_compaction = report
        data = {"kind": kind, "before": before, "after": report.after, "summary": source}
        sink(Observed("agent.compaction.run", {**data, "messages": len(messages)}))
        return report

    def _original(self, m: Message) -> Message:
        entry = self._originals.get(m.tool_call_id or "") if m.role == "tool" else None
        return entry[1] if entry is not None and entry[0] is m else m

    def _summary_input_tokens(self) -> int:
        """`summary_max_input_tokens`, or less if the summary model's window is smaller
        (the summarizer still clips what it sends: this cut drops the oldest part first)."""
        budget = self.settings.summary_max_input_tokens
        if isinstance(self.summarizer, ProviderSummarizer):
            budget = min(budget, self.summarizer.max_input_tokens)
        return budget

    async def _summary_text(
        self, head: list[Message], deep: bool, ranked: str | None = None
    ) -> tuple[str, Literal["llm", "truncation"]]:
        """The summary message's text; `ranked`: the summary input already chosen by score."""
        budget = self._summary_input_tokens()
        cap = max(256, self.window // 7)  # a summary must stay well under the window
        text = ""
        if self.summarizer is not None:
            body = ranked or render(head, self.counter, budget - SUMMARY_PROMPT_OVERHEAD)
            prompt = SUMMARY_PROMPT.format(body=body)
            try:
                text = clip((await self.summarizer(prompt)).strip(), cap)
            except Exception:  # any failure: truncation below keeps the work going
                log.warning("summary call failed; truncating instead", exc_info=True)
                text = ""
        source: Literal["llm", "truncation"] = "llm" if text else "truncation"
        if not text:
            text = truncation_summary(head, cap)
        header = f"{SUMMARY_HEADER} {DEEP_MARKER}" if deep else SUMMARY_HEADER
        budget = max(128, self.window // 10)  # all pins together
        pins = pinned_results(head, min(self.settings.taco_threshold, budget), budget)
        parts = [header, text, *pins]
        if self.after_summary is not None and (extra := self.after_summary()):
            parts.append(extra)
        return "\n\n".join(parts), source

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
            return _with_content(result, text)
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
