"""Loop resilience (docs/durability.md): tool-loop detection with an escalation ladder, the
doom-loop
stop, and per-run time limits. Tool retries live in `core.tools.executor`.

Both pieces are plain state machines the loop drives; each emits its own `Observed`
event (docs/operations.md#events) to the sink it was given, and leaves what to do to the loop:

    detector = LoopDetector(sink=sink)          # per run; reset() on a new user turn
    verdict = detector.observe(call, result)    # after every tool result, in order
    # L1/L2: add verdict.message for the model; L3 or "doom": ask_human / stop with
    # stop_message(verdict).

    limits = TimeLimits(clock=clock, sink=sink)
    limits.start()
    match limits.check():                       # before every LLM call
        case "soft": one tool-less turn with SOFT_LIMIT_PROMPT, then finish
        case "hard": stop with HARD_LIMIT_TEXT
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import field
from typing import Any, Literal

from core.clock import Clock, SystemClock
from core.events import EventName, EventSink, Observed, discard
from core.messages import Message, ToolCall
from core.records import record

LoopKind = Literal["identical", "pattern", "doom"]
TimeState = Literal["ok", "soft", "hard"]

MAX_LEVEL = 3

SOFT_LIMIT_PROMPT = (
    "Time is almost up for this task. Do not call any more tools. Reply now with a short "
    "summary for the user: what you did, what you found, and what is left to do."
)
"""Sent as a user message for the one tool-less turn at the soft time limit."""

SOFT_LIMIT_NOTICE = "Time limit near: asking the agent to summarise what it did."
"""Shown to the human when the soft limit fires."""

HARD_LIMIT_TEXT = "Stopped: the run reached its hard time limit."
"""The terminal notice when the hard time limit aborts a run."""


@record(frozen=True, slots=True)
class LoopVerdict:
    """A detected tool loop.

    Attributes:
        level: escalation level after this detection: 1 nudge, 2 directive, 3 stop
            (force `ask_human` when interactive, stop with a summary in cron).
            A doom loop is always 3.
        kind: "identical", "pattern" or "doom" (the run must end now).
        tool: the tool being repeated.
        message: for the model at levels 1–2; at level 3 (and for doom) it is for the
            user and says why the run stopped.
        count: how many calls made up the repetition.
    """

    level: int
    kind: LoopKind
    tool: str
    message: str
    count: int = 0

    @property
    def stops(self) -> bool:
        """True when the loop must stop (or hand over to a human) instead of nudging."""
        return self.kind == "doom" or self.level >= MAX_LEVEL


def normalise_arguments(raw: str) -> str:
    """A canonical form of a call's JSON arguments: keys sorted, whitespace inside
    strings collapsed; text that is not JSON is compared with its whitespace collapsed."""
    try:
        data = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return " ".join(raw.split())
    return json.dumps(_canonical(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def stop_message(verdict: LoopVerdict) -> str:
    """Text for the user saying why the run ended on this verdict."""
    tool, count = f"`{verdict.tool}`", verdict.count
    if verdict.kind == "doom":
        return (
            f"Stopped: the agent called {tool} with the same arguments {count} times "
            "and got the same result each time."
        )
    if verdict.kind == "identical":
        return (
            f"Stopped: the agent kept calling {tool} with the same arguments "
            f"({count} times among its recent calls) after being warned."
        )
    return (
        f"Stopped: the agent kept calling {tool} with varying arguments ({count} times "
        "among its recent calls) without making progress, after being warned."
    )


def _model_message(kind: LoopKind, level: int, tool: str, count: int) -> str:
    """The nudge (L1) or directive (L2) for the model."""
    if level == 1 and kind == "identical":
        return (
            f"You have called `{tool}` with the same arguments {count} times; the result "
            "will not change. Try a different approach or answer with what you have."
        )
    if level == 1:
        return (
            f"You have called `{tool}` {count} times in your last few tool calls with "
            "varying arguments and are not making progress. Try a different approach or a "
            "different tool, or answer with what you have."
        )
    how = "the same call" if kind == "identical" else "variations of the same call"
    return (
        f"Stop calling `{tool}`. You keep repeating {how} after being warned. Do not call "
        f"`{tool}` again in this turn: answer now with what you have, or say what is "
        "blocking you."
    )


@record(frozen=True, slots=True)
class _Entry:
    tool: str
    arguments: str
    result: tuple[bool, str]


@record(slots=True)
class LoopDetector:
    """Watches the tool calls of one run for thrash and doom loops (docs/durability.md).

    Attributes:
        window: how many recent calls the thrash detectors look at.
        identical: same (tool, normalised arguments) this often in the window → thrash.
        pattern: same tool this often in the window with differing arguments and no
            progress (an error, an empty result, or a result another call also got).
        doom: this many consecutive identical calls with identical results → stop now.
        sink: receives `agent.loop.detected` for every detection.
    """

    window: int = 6
    identical: int = 3
    pattern: int = 4
    doom: int = 3
    sink: EventSink = discard
    level: int = field(default=0, init=False)
    # made at the first call: a conversation's template detector (copied for each run)
    # and an idle one hold none
    _recent: deque[_Entry] | None = field(default=None, init=False, repr=False)

    def reset(self) -> None:
        """Forget the window and the escalation level (a new user turn)."""
        self._recent = None
        self.level = 0

    def observe(self, call: ToolCall, result: Message) -> LoopVerdict | None:
        """Record one tool result; return a verdict if this call completes a loop."""
        entry = _Entry(
            call.name, normalise_arguments(call.arguments), (result.is_error, result.content)
        )
        if self._recent is None:
            self._recent = deque(maxlen=self.window)
        self._recent.append(entry)
        found = self._detect(entry)
        if found is None:
            return None
        kind, count = found
        # The repetition has been reported: start a fresh window so the next call does not
        # report it again; the level stays, so a relapse escalates.
        self._recent = None
        self.level = MAX_LEVEL if kind == "doom" else min(self.level + 1, MAX_LEVEL)
        verdict = LoopVerdict(self.level, kind, call.name, "", count)
        message = (
            stop_message(verdict)
            if verdict.stops
            else _model_message(kind, self.level, call.name, count)
        )
        self.sink(
            Observed(
                "agent.loop.detected",
                {"tier": kind, "level": self.level, "tool": call.name, "count": count},
            )
        )
        return LoopVerdict(self.level, kind, call.name, message, count)

    def _detect(self, entry: _Entry) -> tuple[LoopKind, int] | None:
        recent = list(self._recent or ())
        tail = recent[-self.doom :]
        if len(tail) == self.doom and all(other == entry for other in tail):
            return "doom", self.doom
        same_tool = [e for e in recent if e.tool == entry.tool]
        same_call = sum(1 for e in same_tool if e.arguments == entry.arguments)
        if same_call >= self.identical:
            return "identical", same_call
        # Pattern thrash is variations that get nowhere (docs/durability.md): errors, empty results,
        # or a result another variation already gave. Reading 20 different files is work.
        results = Counter(e.result for e in same_tool)
        stuck = [
            e for e in same_tool if e.result[0] or not e.result[1].strip() or results[e.result] > 1
        ]
        if len(stuck) >= self.pattern and len({e.arguments for e in stuck}) > 1:
            return "pattern", len(stuck)
        return None


@record(slots=True)
class TimeLimits:
    """Soft and hard wall-clock limits of one run, in seconds (docs/durability.md).

    `check()` says "soft" once, when the soft limit is first passed (the loop then runs one
    tool-less summary turn), and "hard" from the hard limit on (the loop aborts).
    """

    soft: float = 900.0
    hard: float = 1200.0
    clock: Clock = field(default_factory=SystemClock)
    sink: EventSink = discard
    _started: float | None = field(default=None, init=False, repr=False)
    _soft_fired: bool = field(default=False, init=False, repr=False)
    _hard_fired: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.soft <= self.hard:
            raise ValueError(f"time limits need 0 < soft <= hard, got {self.soft}, {self.hard}")

    def start(self) -> None:
        """Start (or restart) the run's clock."""
        self._started = self.clock.monotonic()
        self._soft_fired = self._hard_fired = False

    @property
    def elapsed(self) -> float:
        """Seconds since `start()`; 0 before it."""
        return 0.0 if self._started is None else self.clock.monotonic() - self._started

    @property
    def remaining(self) -> float:
        """Seconds left before the hard limit (for bounding one call with a timeout)."""
        return max(0.0, self.hard - self.elapsed)

    def check(self) -> TimeState:
        """Where the run stands; starts the clock if `start()` was not called."""
        if self._started is None:
            self.start()
        elapsed = self.elapsed
        if elapsed >= self.hard:
            if not self._hard_fired:
                self._hard_fired = True
                self._emit("agent.exhaustion.hard_limit", elapsed)
            return "hard"
        if elapsed >= self.soft and not self._soft_fired:
            self._soft_fired = True
            self._emit("agent.exhaustion.soft_limit", elapsed)
            return "soft"
        return "ok"

    def _emit(self, name: EventName, elapsed: float) -> None:
        self.sink(Observed(name, {"elapsed": elapsed, "soft": self.soft, "hard": self.hard}))
