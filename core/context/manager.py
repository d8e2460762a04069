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
(`eviction.py`). "focus" (docs/context.md#the-focus-strategy, `focus.py`): the model compresses
its own explorations into a pinned Knowledge block, which compaction keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from core.context.eviction import PROTECTED, ranked_render_async
from core.context.settings import ContextSettings
from core.context.summarize import SUMMARY_PROMPT, SUMMARY_PROMPT_OVERHEAD, Summarizer
from core.context.taco import TACO_HEADER as TACO_HEADER
from core.context.taco import ToolOutputs
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
from core.records import record

if TYPE_CHECKING:
    from core.context.focus import FocusTracker
    from core.context.subgoals import SubgoalTracker

Pressure = Literal["ok", "ask_human", "stop"]
Stage = Literal["R1", "R2", "R3"]

DEEP_MARKER = "(deep pruned)"
log = logging.getLogger(__name__)


@record(frozen=True, slots=True)
class CompactionReport:
    """One compaction: its kind ("mask", "R1", "R2", "manual") and token counts."""

    kind: str
    before: int
    after: int
    summary: Literal["llm", "truncation", "none"] = "none"


def _with_content(message: Message, text: str) -> Message:
    return message.with_changes(content=text)  # with no cached count or JSON


class ContextManager(ToolOutputs):
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
        strategy = self.settings.strategy
        tracking = strategy in ("subgoal", "subgoal_mig")
        # Each strategy's tracker (and its module) is loaded only for that strategy.
        self.subgoals: SubgoalTracker | None = None
        if tracking:
            from core.context.subgoals import SubgoalTracker

            self.subgoals = SubgoalTracker(summarizer)
        self.focus: FocusTracker | None = None
        self.start_turn()  # the counters; a focus counts turns from the first real one
        if strategy == "focus":
            from core.context.focus import FocusTracker

            self.focus = FocusTracker(self.settings.focus, counter, summarizer)

    def subgoal_status(self) -> str | None:
        """The active subgoal for `/status`; None when the strategy tracks none."""
        if self.subgoals is None:
            return None
        return self.subgoals.active_text() or "none yet"

    def focus_status(self, messages: list[Message]) -> str | None:
        """The active focus and the Knowledge block's size for `/status` (focus only)."""
        return None if self.focus is None else self.focus.status(messages)

    async def aclose(self) -> None:
        """Cancel a subgoal extraction or a focus consolidation still in flight."""
        if self.subgoals is not None:
            await self.subgoals.aclose()
        if self.focus is not None:
            await self.focus.aclose()

    def start_turn(self) -> None:
        """Reset the per-turn recovery counters (call at each new user turn)."""
        if self.focus is not None:
            self.focus.start_turn()
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
        if self.focus is not None:
            self.focus.reset()

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
        if self.focus is not None and (saved := self.focus.step(messages)) is not None:
            self._forget_counts()  # whole blocks removed: still valid, counted again
            self._validated.mark(messages)
            after = self.tokens(messages)
            self.last_compaction = CompactionReport("focus", after + saved, after)
            data = {"kind": "focus", "before": after + saved, "after": after}
            sink(Observed("agent.compaction.run", data))
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
        if self.focus is not None:
            self.focus.update(messages)
            self._forget_counts()
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
        # In batches (docs/cost.md#prompt-caching): each rewrite of an old message breaks
        # the cached prefix from there on, so wait for `mask_batch` outputs to mask —
        # unless compaction is near, when every token counts.
        due = self._mask_range(messages, 0, stop, placeholder, count_only=True)
        batching = any(m.content == placeholder for m in messages[:stop] if m.role == "tool")
        if batching and due < self.settings.mask_batch and used < self.compact_at:
            return used
        masked = self._mask_range(messages, 0, stop, placeholder)
        if not masked:
            return used
        self._forget_counts()  # replaced in place: first/last identity cannot tell
        after = self.tokens(messages)
        self.last_compaction = CompactionReport("mask", used, after)
        data = {"kind": "mask", "before": used, "after": after, "masked": masked}
        sink(Observed("agent.compaction.run", data))
        return after

    def _mask_range(
        self,
        messages: list[Message],
        start: int,
        stop: int,
        placeholder: str,
        *,
        count_only: bool = False,
    ) -> int:
        """Mask the tool outputs of `messages[start:stop]` bigger than `placeholder`
        (`count_only`: count them, change nothing)."""
        smallest = self.counter.text(placeholder) + 8  # masking must save tokens
        masked = 0
        for i in range(start, stop):
            m = messages[i]
            if m.role != "tool" or m.content == placeholder or self.counter.message(m) < smallest:
                continue
            if count_only:
                masked += 1
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
        if track is None and self.focus is None:
            return await self._replace_head(messages, keep, kind, sink, deep)
        if track is not None:
            track.registry.sync(messages)
            track.hold()  # an extraction reply arriving meanwhile must not move the spans
        try:
            report = await self._replace_head(messages, keep, kind, sink, deep)
            active = self._active_start(messages)
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
            if track is not None:
                track.release()

    def _active_start(self, messages: list[Message]) -> int | None:
        """Where the active subgoal or focus starts: compaction never cuts into it."""
        if self.subgoals is not None:
            return self.subgoals.registry.active_start()
        if self.focus is not None:
            self.focus.update(messages)  # after a rewrite: read again (nothing to apply)
            return self.focus.active_start()
        return None

    async def _replace_head(
        self, messages: list[Message], keep: int, kind: str, sink: EventSink, deep: bool
    ) -> CompactionReport:
        before = self.tokens(messages)
        system = messages[:1] if messages and messages[0].role == "system" else []
        if self.focus is not None and len(messages) > len(system):  # Knowledge: pinned
            from core.context.focus import is_knowledge

            system = messages[: len(system) + is_knowledge(messages[len(system)])]
        p = len(system)
        body = messages[p:]
        cut = tail_start(body, keep)
        registry = self.subgoals.registry if self.subgoals is not None else None
        if (active := self._active_start(messages)) is not None:
            from core.context.subgoals import block_start

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
            from core.context.subgoals import TIER_SCORE

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
