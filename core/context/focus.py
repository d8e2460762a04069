"""The Focus strategy (docs/context.md#the-focus-strategy): the model brackets its own
exploration and compresses it into knowledge.

`start_focus(scope)` marks a checkpoint; `complete_focus(summary)` ends it. Before the next
LLM call the `FocusTracker` removes the messages of the bracket (from the assistant message
that called `start_focus` up to the one that called `complete_focus`; the user's own messages
inside it stay) and appends the summary as a segment of the Knowledge block, one user message
pinned right after the system message. Whole blocks go: an assistant message and its tool
results are never split. The block is bounded by `max_knowledge_tokens`: the oldest segment
is evicted first, the newest never.

All of the state lives in the transcript, so it is as durable as the history and needs no
table of its own: the active focus is the latest `start_focus` call that succeeded and was
not completed; the Knowledge block is a message; a completion that was applied says so in
its tool result (applying it again after a restart changes nothing). `/clear` empties the
history, and with it the focus.

Auto-consolidation: every `auto_consolidate_min_window` turns (never before), segments whose
word-set similarity reaches `consolidate_threshold` are merged by one summary call. The
O(K²) scoring runs in a worker thread and the call in a background task the turn never
awaits; the merged segment is put in at the next step, if its sources are still there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Sequence

from core.context.eviction import jaccard, word_set
from core.context.settings import FocusSettings
from core.context.summarize import Summarizer
from core.context.tokens import TokenCounter
from core.context.transcript import clip
from core.messages import Message
from core.records import record

START = "start_focus"
COMPLETE = "complete_focus"
KNOWLEDGE_HEADER = "[Knowledge: what completed focus sessions found]"
SEGMENT = "### Focus: "  # each segment: "### Focus: <scope>\n<summary>"
APPLIED = "Focus completed"  # a completion already applied (its result starts with this)
NO_FOCUS = "No focus was active"  # applied too, with nothing to remove
PENDING = "complete_focus received"  # the tool's own result, rewritten once applied
REMINDER_PREFIX = "[Parley focus] "
MERGE_PROMPT = (
    "These notes were written by an assistant at the end of separate explorations and "
    "overlap. Merge them into one note that keeps every fact, path, number, decision and "
    "open question once.\n\n{body}"
)
log = logging.getLogger(__name__)


@record(frozen=True, slots=True)
class Segment:
    scope: str
    text: str

    def render(self) -> str:
        return f"{SEGMENT}{self.scope}\n{self.text}"


@record(slots=True)
class Active:
    call_id: str
    scope: str
    index: int  # of the assistant message that called start_focus


@record(frozen=True, slots=True)
class _Merge:
    """A consolidation ready to go in: `sources` replaced by one segment."""

    sources: tuple[Segment, ...]
    merged: Segment


def is_knowledge(m: Message) -> bool:
    return m.role == "user" and m.content.startswith(KNOWLEDGE_HEADER)


def knowledge_index(messages: Sequence[Message]) -> int:
    """Where the Knowledge block is (or goes): right after the system message."""
    return 1 if messages and messages[0].role == "system" else 0


def parse_knowledge(content: str) -> list[Segment]:
    body = content.removeprefix(KNOWLEDGE_HEADER).strip("\n")
    out: list[Segment] = []
    for chunk in body.split("\n\n" + SEGMENT):
        chunk = chunk.removeprefix(SEGMENT)
        if not chunk.strip():
            continue
        scope, _, text = chunk.partition("\n")
        out.append(Segment(scope.strip(), text.strip()))
    return out


def render_knowledge(segments: Sequence[Segment]) -> str:
    return "\n\n".join([KNOWLEDGE_HEADER, *(s.render() for s in segments)])


def segments_of(messages: Sequence[Message]) -> list[Segment]:
    k = knowledge_index(messages)
    if k < len(messages) and is_knowledge(messages[k]):
        return parse_knowledge(messages[k].content)
    return []


def _argument(call_arguments: str, key: str) -> str:
    try:
        value = json.loads(call_arguments or "{}").get(key, "")
    except (ValueError, AttributeError):
        value = ""
    return str(value).strip()


def similar_groups(texts: Sequence[str], threshold: float) -> list[list[int]]:
    """Groups (by index, each sorted, biggest first) of texts linked by a pairwise word-set
    similarity of at least `threshold`: O(K²), run off the event loop."""
    sets = [word_set(t) for t in texts]
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in itertools.combinations(range(len(texts)), 2):
        if jaccard(sets[a], sets[b]) >= threshold:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for i in range(len(texts)):
        groups.setdefault(root(i), []).append(i)
    found = [g for g in groups.values() if len(g) > 1]
    return sorted(found, key=lambda g: (-len(g), g[0]))


class FocusTracker:
    """One conversation's focus (see the module doc). `update` runs before every LLM call."""

    def __init__(
        self, settings: FocusSettings, counter: TokenCounter, summarizer: Summarizer | None
    ) -> None:
        self.settings = settings
        self.counter = counter
        self.summarizer = summarizer
        self.active: Active | None = None
        self.explored = 0  # tool steps since the last start or completion
        self.turns = 0  # turns since the last consolidation pass (or the start)
        self.consolidations = 0
        self._list: list[Message] | None = None
        self._n = 0
        self._last: Message | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: _Merge | None = None
        self.saved = 0  # tokens the last `update` took out (the block's growth subtracted)
        self.score = similar_groups  # the pairwise scoring, run in a worker thread

    # ---- following the transcript ----------------------------------------------------------

    def reset(self) -> None:
        """Forget what was scanned: the next `update` reads the whole history again."""
        self._list, self._n, self._last = None, 0, None

    def _scan_from(self, messages: list[Message]) -> int:
        """Where the new messages start; 0 (and a fresh state) unless only appends (or a
        refreshed system message) happened since the last scan."""
        n, last = self._n, self._last
        if messages is self._list and n and len(messages) >= n and messages[n - 1] is last:
            return n
        self.active, self.explored = None, 0
        return 0

    def start_turn(self) -> None:
        self.turns += 1

    def update(self, messages: list[Message]) -> bool:
        """Apply new focus calls (in place); True if the history changed (`saved`: the
        tokens that took)."""
        self.saved = 0
        changed = self._apply_merge(messages)
        i = self._scan_from(messages)
        while i < len(messages):
            m = messages[i]
            stop = i + 1
            while stop < len(messages) and messages[stop].role == "tool":
                stop += 1
            if m.role == "assistant" and m.tool_calls:
                i, stop, edited = self._block(messages, i, stop)
                changed = changed or edited
            i = stop
        self._list, self._n = messages, len(messages)
        self._last = messages[-1] if messages else None
        return changed

    def _block(self, messages: list[Message], i: int, stop: int) -> tuple[int, int, bool]:
        """One assistant message at `i` with its results up to `stop`; the block's new
        position once a completion removed what came before it."""
        m = messages[i]
        edited = False
        if any(c.name not in (START, COMPLETE) for c in m.tool_calls):
            self.explored += 1
        for call in m.tool_calls:
            if call.name not in (START, COMPLETE):
                continue
            j = next((k for k in range(i + 1, stop) if messages[k].tool_call_id == call.id), None)
            if j is None:
                continue
            result = messages[j]
            if call.name == START:
                if result.is_error:
                    continue
                if self.active is not None and self.active.call_id != call.id:
                    text = (
                        f"error: a focus is already active ({self.active.scope}); call "
                        "complete_focus before starting another"
                    )
                    self._replace(messages, j, Message.tool_result(call, text, is_error=True))
                    edited = True
                    continue
                scope = _argument(call.arguments, "scope") or "(unnamed)"
                self.active, self.explored = Active(call.id, scope[:200], i), 0
                continue
            if result.is_error or not result.content.startswith(PENDING):
                self.active, self.explored = None, 0  # applied before (or refused)
                continue
            had_focus = self.active is not None
            shift, added = self._complete(messages, i, call.arguments)
            i, j, stop = i - shift + added, j - shift + added, stop - shift + added
            if had_focus:
                note = (
                    f"{APPLIED}: the exploration since start_focus was replaced by your "
                    "summary in the Knowledge block."
                )
            else:
                note = f"{NO_FOCUS}: your summary was added to the Knowledge block."
            self._replace(messages, j, Message.tool_result(call, note))
            edited = True
        return i, stop, edited

    def _complete(self, messages: list[Message], at: int, arguments: str) -> tuple[int, int]:
        """Close the active focus at the assistant message `at`: remove its bracket and add
        the summary to the Knowledge block. Returns (messages removed before `at`, messages
        inserted before it)."""
        active, removed = self.active, 0
        if active is not None and active.index < at:
            start = active.index
            kept = [
                m
                for m in messages[start:at]
                if m.role == "user" and not m.content.startswith(REMINDER_PREFIX)
            ]
            removed = (at - start) - len(kept)
            self.saved += sum(map(self.counter.message, messages[start:at]))
            self.saved -= sum(map(self.counter.message, kept))
            messages[start:at] = kept
        summary = _argument(arguments, "summary") or "(no summary given)"
        summary = clip(summary, self.settings.max_knowledge_tokens)
        scope = active.scope if active is not None else "(no focus)"
        added = self._add_segment(messages, Segment(scope, summary))
        self.active, self.explored = None, 0
        return removed, added

    def _add_segment(self, messages: list[Message], segment: Segment) -> int:
        """Append `segment` to the Knowledge block (made if missing); 1 if the block was
        inserted, else 0."""
        k = knowledge_index(messages)
        exists = k < len(messages) and is_knowledge(messages[k])
        segments = [*parse_knowledge(messages[k].content), segment] if exists else [segment]
        self._store(messages, self._bounded(segments))
        return 0 if exists else 1

    def _bounded(self, segments: list[Segment]) -> list[Segment]:
        """Within `max_knowledge_tokens`: oldest first out, never the newest."""
        cap = self.settings.max_knowledge_tokens
        while len(segments) > 1 and self.counter.text(render_knowledge(segments)) > cap:
            segments = segments[1:]
        return segments

    def _replace(self, messages: list[Message], at: int, new: Message) -> None:
        self.saved += self.counter.message(messages[at]) - self.counter.message(new)
        messages[at] = new

    def _store(self, messages: list[Message], segments: list[Segment]) -> None:
        k = knowledge_index(messages)
        block = Message.user(render_knowledge(segments))
        if k < len(messages) and is_knowledge(messages[k]):
            self._replace(messages, k, block)
        else:
            messages.insert(k, block)
            self.saved -= self.counter.message(block)
            if self.active is not None and self.active.index >= k:
                self.active.index += 1

    def step(self, messages: list[Message]) -> int | None:
        """Before an LLM call: apply completed focuses, remind if due, start a consolidation
        pass if one is due. The tokens saved if messages were removed or replaced."""
        changed = self.update(messages)
        nudge = self.reminder()
        if nudge is not None and messages and messages[-1].content != nudge.content:
            messages.append(nudge)
        self.maybe_consolidate(messages)
        return self.saved if changed else None

    # ---- the reminder --------------------------------------------------------------------

    def reminder(self) -> Message | None:
        """A nudge every `compression_interval` tool steps without a completed focus."""
        every = self.settings.compression_interval
        if self.explored == 0 or self.explored % every:
            return None
        if self.active is not None:
            text = (
                f"You have explored '{self.active.scope}' for {self.explored} steps. If you "
                "have what you need, call complete_focus with a summary of what you found."
            )
        else:
            text = (
                f"You have explored for {self.explored} steps without a focus. Call "
                "start_focus(scope) before exploring further and complete_focus(summary) when "
                "done: the exploration is then kept as knowledge and the context stays small."
            )
        return Message.user(REMINDER_PREFIX + text)

    # ---- auto-consolidation ----------------------------------------------------------------

    def should_auto_consolidate(self) -> bool:
        """False until `auto_consolidate_min_window` turns have passed since the last pass."""
        return self.turns >= self.settings.auto_consolidate_min_window

    def maybe_consolidate(self, messages: list[Message]) -> None:
        """Start a consolidation pass in the background if the window has elapsed (returns
        at once; at most one pass at a time)."""
        if self.summarizer is None or self._tasks or not self.should_auto_consolidate():
            return
        segments = segments_of(messages)
        if len(segments) < 2:
            return
        self.turns = 0  # the window starts again, whatever the pass finds
        task = asyncio.get_running_loop().create_task(self._consolidate(tuple(segments)))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _consolidate(self, segments: tuple[Segment, ...]) -> None:
        assert self.summarizer is not None
        texts = [s.text for s in segments]
        threshold = self.settings.consolidate_threshold
        groups = await asyncio.to_thread(self.score, texts, threshold)  # O(K²): off the loop
        if not groups:
            return
        sources = tuple(segments[i] for i in groups[0])
        body = "\n\n".join(s.render() for s in sources)
        text = (await self.summarizer(MERGE_PROMPT.format(body=body))).strip()
        if not text:
            return
        scopes = dict.fromkeys(s.scope for s in sources)
        scope = " + ".join(scopes)[:200]
        merged = Segment(scope, clip(text, self.settings.max_knowledge_tokens))
        self._pending = _Merge(sources, merged)

    def _apply_merge(self, messages: list[Message]) -> bool:
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        segments = segments_of(messages)
        if not all(s in segments for s in pending.sources):
            return False  # the block changed meanwhile: the merge is stale
        last = max(segments.index(s) for s in pending.sources)
        out = [
            pending.merged if i == last else s
            for i, s in enumerate(segments)
            if i == last or s not in pending.sources
        ]
        self._store(messages, self._bounded(out))
        self.consolidations += 1
        self.reset()  # positions moved: read the history again
        return True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("focus auto-consolidation failed: %r", exc, exc_info=exc)

    async def settle(self) -> None:
        """Wait for the pass in flight, if any (tests and benchmarks)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        for task in set(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    # ---- reading ---------------------------------------------------------------------------

    def active_start(self) -> int | None:
        return None if self.active is None else self.active.index

    def status(self, messages: Sequence[Message]) -> str:
        """`/status`: the active focus and the Knowledge block's size (read-only)."""
        probe = FocusTracker(self.settings, self.counter, None)
        probe._read_only(messages)
        focus = f"'{probe.active.scope}'" if probe.active is not None else "none"
        segments = segments_of(messages)
        size = self.counter.text(render_knowledge(segments)) if segments else 0
        cap = self.settings.max_knowledge_tokens
        return f"{focus}; knowledge {len(segments)} segments, {size:,} / {cap:,} tokens"

    def _read_only(self, messages: Sequence[Message]) -> None:
        """The active focus as the transcript says, without applying anything."""
        for i, m in enumerate(messages):
            for call in m.tool_calls if m.role == "assistant" else ():
                if call.name == START:
                    ok = any(
                        r.role == "tool" and r.tool_call_id == call.id and not r.is_error
                        for r in messages[i + 1 : i + 1 + len(m.tool_calls)]
                    )
                    if ok and self.active is None:
                        self.active = Active(call.id, _argument(call.arguments, "scope"), i)
                elif call.name == COMPLETE:
                    self.active = None
