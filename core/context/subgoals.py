"""HiAgent subgoal tracking (docs/context.md#context-strategies): which messages serve the step in
progress.

A `SubgoalRegistry` holds subgoals with message spans `[start, end)` into one conversation's
history; the active subgoal's end is open (it grows with every append at no cost). Tiers for
eviction: a message of the active subgoal is `active` (1.0, never evicted), of the most
recently completed one `completed` (0.3), anything else `outdated` (0.1): before the first
subgoal, or in a subgoal completed before the latest completed one.

Spans are repaired by offset arithmetic only (`insert`, `remove`), never by scanning the
messages: compaction is "remove the head, insert the summary"; a system message put in front
of the history is "insert one at 0".

A `SubgoalTracker` refreshes the registry between the steps of the tool loop: a small LLM
call over the last `WINDOW` visible messages, started as a tracked task and never awaited by
the loop. The reply protocol: `SUBGOAL: <text>` opens a subgoal (closing any active one),
`COMPLETED:` closes the active one, anything else changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import field
from typing import Literal

from core.context.eviction import jaccard, word_set
from core.context.summarize import Summarizer
from core.context.transcript import as_text, clip, is_summary
from core.messages import Message
from core.records import record

Tier = Literal["active", "completed", "outdated"]
TIER_SCORE: dict[Tier, float] = {"active": 1.0, "completed": 0.3, "outdated": 0.1}
WINDOW = 6  # visible messages the extraction sees
RECENT_COMPLETED = 1  # completed subgoals kept at the `completed` tier; older are outdated
EXCERPT_TOKENS = 300  # per message in the extraction prompt: big tool outputs are cut
SAME_SUBGOAL = 0.6  # word-set similarity above which a "new" subgoal is the active one

SUBGOAL_PROMPT = (
    "Below are the latest messages of a conversation between a user and a tool-using "
    "assistant. The assistant's current subgoal is: {current}.\n"
    "Decide what the assistant is working on now and answer with one line only:\n"
    "SUBGOAL: <the step in progress, under 15 words> - if a new step has started;\n"
    "COMPLETED: - if the current subgoal is finished and no new step has started;\n"
    "NONE - if the current subgoal is unchanged.\n\n<messages>\n{body}\n</messages>"
)
log = logging.getLogger(__name__)


@record(slots=True, eq=False)  # identity: two subgoals may read alike
class Subgoal:
    """One subgoal; `end` is None while it is active (its span runs to the history's end)."""

    text: str
    start: int
    end: int | None = None

    @property
    def active(self) -> bool:
        return self.end is None


@record(slots=True)
class Mark:
    """An index into the history that compaction moves like a span boundary (an extraction
    in flight keeps its window's positions in marks)."""

    index: int
    valid: bool = True


def _shift_removed(index: int, start: int, stop: int) -> int:
    """`index` after `messages[start:stop]` is deleted (an index inside lands on `start`)."""
    if index <= start:
        return index
    return start if index <= stop else index - (stop - start)


@record(slots=True)
class SubgoalRegistry:
    """Subgoals of one conversation with their message spans (see the module doc)."""

    subgoals: list[Subgoal] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    opened: int = 0  # subgoals ever opened: the first one tags the messages before it
    _list: list[Message] | None = None
    _n: int = 0
    _first: Message | None = None
    _last: Message | None = None

    def active(self) -> Subgoal | None:
        last = self.subgoals[-1] if self.subgoals else None
        return last if last is not None and last.active else None

    def active_start(self) -> int | None:
        active = self.active()
        return None if active is None else active.start

    def tier(self, index: int) -> Tier:
        """The eviction tier of the message at `index`."""
        completed = [s for s in self.subgoals if not s.active]
        recent = completed[-RECENT_COMPLETED:] if RECENT_COMPLETED else []
        for s in reversed(self.subgoals):
            end = s.end
            if s.start <= index and (end is None or index < end):
                return "active" if end is None else "completed" if s in recent else "outdated"
        return "outdated"

    def tiers(self, n: int) -> list[Tier]:
        """The tier of each of `n` messages: O(n + subgoals)."""
        out: list[Tier] = ["outdated"] * n
        completed = [s for s in self.subgoals if not s.active]
        recent = completed[-RECENT_COMPLETED:] if RECENT_COMPLETED else []
        for s in self.subgoals:
            tier: Tier = "active" if s.active else "completed" if s in recent else "outdated"
            end = n if s.end is None else min(s.end, n)
            out[s.start : end] = [tier] * max(0, end - s.start)
        return out

    # ---- lifecycle of subgoals -----------------------------------------------------------

    def open(self, text: str, start: int) -> Subgoal:
        """Open a subgoal at `start`, closing the active one there (a start at or before the
        active one's start renames it instead: the extractor refined its description)."""
        active = self.active()
        if active is not None and start <= active.start:
            active.text = text
            return active
        if active is not None:
            active.end = start
        elif self.subgoals and (end := self.subgoals[-1].end) is not None:
            start = min(start, end)  # what followed a completion belongs to the next subgoal
        new = Subgoal(text, start)
        self.subgoals.append(new)
        self.opened += 1
        return new

    def complete(self, at: int) -> Subgoal | None:
        """Close the active subgoal at `at` (an index past its last message)."""
        active = self.active()
        if active is not None:
            active.end = max(active.start, at)
            if active.end == active.start:
                self.subgoals.remove(active)  # nothing in it
        return active

    # ---- offset arithmetic ---------------------------------------------------------------

    def insert(self, at: int, count: int) -> None:
        """`count` messages were inserted at `at`: everything from `at` moves up."""
        for s in self.subgoals:
            s.start += count if s.start >= at else 0
            if s.end is not None and s.end > at:
                s.end += count
        for m in self.marks:
            m.index += count if m.index >= at else 0
        self._n += count

    def remove(self, start: int, stop: int) -> None:
        """`messages[start:stop]` were deleted: spans inside shrink, later ones move down;
        a completed subgoal left empty is forgotten (its messages are in the summary)."""
        if stop <= start:
            return
        kept: list[Subgoal] = []
        for s in self.subgoals:
            s.start = _shift_removed(s.start, start, stop)
            if s.end is not None:
                s.end = _shift_removed(s.end, start, stop)
                if s.end <= s.start:
                    continue
            kept.append(s)
        self.subgoals = kept
        for m in self.marks:
            m.index = _shift_removed(m.index, start, stop)
        self._n = max(0, self._n - (stop - start))

    def rebuild_after_compaction(self, start: int, stop: int, inserted: int) -> None:
        """Compaction replaced `messages[start:stop]` by `inserted` messages (the summary and
        the request kept verbatim): offset arithmetic only."""
        self.remove(start, stop)
        self.insert(start, inserted)

    def reset(self) -> None:
        """Forget everything (`/clear`, a restored or repaired history)."""
        self.subgoals.clear()
        for m in self.marks:
            m.valid = False
        self.marks.clear()
        self.opened = 0
        self._list, self._n, self._first, self._last = None, 0, None, None

    def mark(self, index: int) -> Mark:
        mark = Mark(index)
        self.marks.append(mark)
        return mark

    def unmark(self, *marks: Mark) -> None:
        self.marks = [m for m in self.marks if all(m is not x for x in marks)]

    # ---- following the message list -------------------------------------------------------

    def sync(self, messages: list[Message]) -> None:
        """Follow `messages` since the last call in O(1): appends extend the active span; a
        system message put in front shifts every span; anything else resets the registry."""
        if self._list is not None and not self._follows(messages):
            log.debug("history rewritten outside compaction: subgoal spans reset")
            self.reset()
        self.adopt(messages)

    def adopt(self, messages: list[Message]) -> None:
        """Take `messages` as the list the spans point into, as it is now."""
        self._list, self._n = messages, len(messages)
        self._first = messages[0] if messages else None
        self._last = messages[-1] if messages else None

    def stale(self) -> bool:
        """Whether the followed list shrank since the last sync (`/clear`)."""
        return self._list is not None and len(self._list) < self._n

    def _follows(self, messages: list[Message]) -> bool:
        """Only appends, a refreshed system message, or a system message put in front."""
        n, first = self._n, self._first
        if messages is not self._list or len(messages) < n:
            return False
        if first is None or n == 0:
            return True
        shift = 0
        if messages[0] is not first:
            refreshed = messages[0].role == "system" and first.role == "system"
            if len(messages) > n and messages[1] is first and messages[0].role == "system":
                shift = 1
            elif not refreshed:
                return False
        if n > 1 and messages[n - 1 + shift] is not self._last:
            return False  # an old message replaced or removed (`/clear`, a resume)
        if shift:
            self.insert(0, 1)
        return True


def parse_reply(reply: str) -> list[tuple[Literal["open", "complete"], str]]:
    """The actions in an extraction reply, in order (see the module doc)."""
    actions: list[tuple[Literal["open", "complete"], str]] = []
    for raw in reply.splitlines():
        line = raw.strip().strip("*`_ ").strip()
        head, _, rest = line.partition(":")
        match head.strip().upper():
            case "SUBGOAL" if rest.strip(" *`-"):
                actions.append(("open", rest.strip(" *`-")[:200]))
            case "COMPLETED":
                actions.append(("complete", ""))
            case _:
                pass
    return actions


def same_subgoal(a: str, b: str) -> bool:
    """Whether two descriptions name the same step: equal words, or mostly the same ones
    (a model restating the subgoal must not cut it in two)."""
    return jaccard(word_set(a), word_set(b)) >= SAME_SUBGOAL


def block_start(messages: Sequence[Message], index: int) -> int:
    """`index`, moved back past tool results to the assistant message that made the calls."""
    while 0 < index < len(messages) and messages[index].role == "tool":
        index -= 1
    return index


def floor_of(messages: Sequence[Message]) -> int:
    """First index a subgoal may cover: after the system message and any summary."""
    floor = 1 if messages and messages[0].role == "system" else 0
    if floor < len(messages) and is_summary(messages[floor]):
        floor += 1
    return floor


@record(slots=True)
class _Window:
    """An extraction in flight: its prompt and the positions it judged, as marks."""

    prompt: str
    start: Mark  # the window's first block: where a first subgoal starts
    last_user: Mark | None  # the newest user request in the window
    last_block: Mark  # the newest step (assistant message with its results, or a message)
    end: Mark  # the history's end when the window was taken: where COMPLETED closes


class SubgoalTracker:
    """Keeps a `SubgoalRegistry` up to date by fire-and-forget extraction calls.

    `refresh` never awaits: it starts at most one extraction task at a time, kept in a set
    with a done-callback that logs its failure (a failure never reaches a run).
    """

    def __init__(self, summarizer: Summarizer | None) -> None:
        self.summarizer = summarizer
        self.registry = SubgoalRegistry()
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: Mark | None = None  # the history's end at the last extraction
        self._held = 0  # >0 while compaction runs: replies wait, spans must not move
        self._deferred: list[tuple[_Window, str]] = []

    def active_text(self) -> str | None:
        if self.registry.stale():
            self.registry.reset()
        active = self.registry.active()
        return None if active is None else active.text

    def refresh(self, messages: list[Message]) -> None:
        """Follow `messages` and, if new messages came since the last extraction and none
        is in flight, start one in the background (returns at once)."""
        reg = self.registry
        reg.sync(messages)
        if self.summarizer is None or self._tasks:
            return
        seen = self._seen.index if self._seen is not None and self._seen.valid else 0
        if len(messages) <= max(seen, floor_of(messages)):
            return  # nothing new since the last look (compaction moves the mark too)
        if self._seen is not None:
            reg.unmark(self._seen)
        self._seen = reg.mark(len(messages))
        window = self._window(messages)
        task = asyncio.get_running_loop().create_task(self._extract(window))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _window(self, messages: list[Message]) -> _Window:
        n, floor, reg = len(messages), floor_of(messages), self.registry
        start = block_start(messages, max(floor, n - WINDOW))
        user = next(
            (i for i in range(n - 1, start - 1, -1) if messages[i].role == "user"),
            None,
        )
        shown = "\n\n".join(as_text(_excerpt(m)) for m in messages[max(start, n - WINDOW) :])
        active = reg.active()
        current = f'"{active.text}"' if active is not None else "none yet"
        return _Window(
            SUBGOAL_PROMPT.format(current=current, body=shown),
            reg.mark(start),
            None if user is None or is_summary(messages[user]) else reg.mark(user),
            reg.mark(block_start(messages, n - 1)),
            reg.mark(n),
        )

    async def _extract(self, window: _Window) -> None:
        assert self.summarizer is not None
        try:
            reply = await self.summarizer(window.prompt)
        except BaseException:
            self._release(window)
            raise
        if self._held:
            self._deferred.append((window, reply))
        else:
            self._apply(window, reply)

    def _apply(self, window: _Window, reply: str) -> None:
        try:
            if not window.end.valid:
                return  # the history was reset meanwhile: the positions mean nothing now
            reg = self.registry
            for action, text in parse_reply(reply):
                active = reg.active()
                if action == "complete":
                    reg.complete(window.end.index)
                elif active is not None and same_subgoal(text, active.text):
                    continue  # the same subgoal, said again (maybe in other words)
                elif reg.opened == 0:
                    reg.open(text, window.start.index)  # tags what came before the first
                else:
                    user = window.last_user
                    after = active.start if active is not None else -1
                    fresh = user is not None and user.index > after
                    reg.open(text, user.index if fresh and user else window.last_block.index)
            log.debug("subgoals: %s", [(s.text, s.start, s.end) for s in reg.subgoals])
        finally:
            self._release(window)

    def _release(self, window: _Window) -> None:
        marks = [window.start, window.last_block, window.end]
        self.registry.unmark(*marks, *([window.last_user] if window.last_user else []))

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            self.failures += 1
            log.warning("subgoal extraction failed: %r", exc, exc_info=exc)

    def hold(self) -> None:
        """Compaction starts: extraction replies wait until `release`."""
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if not self._held:
            deferred, self._deferred = self._deferred, []
            for window, reply in deferred:
                self._apply(window, reply)

    async def settle(self) -> None:
        """Wait for the extraction in flight, if any (benchmarks and tests)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        """Cancel the extraction in flight."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _excerpt(m: Message) -> Message:
    if len(m.content) <= EXCERPT_TOKENS * 4:
        return m
    return m.with_changes(content=clip(m.content, EXCERPT_TOKENS))
