"""Per-run time limits (docs/durability.md) on a fake clock."""

from __future__ import annotations

import pytest

from core.events import LoopEvent, Observed
from core.resilience import TimeLimits
from tests.fakes.clock import FakeClock


def test_ok_then_soft_once_then_hard() -> None:
    clock, events = FakeClock(start=100.0), list[LoopEvent]()
    limits = TimeLimits(clock=clock, sink=events.append)
    limits.start()
    assert limits.check() == "ok"
    clock.now += 899
    assert (limits.check(), limits.elapsed) == ("ok", 899)
    clock.now += 1
    assert limits.check() == "soft"
    assert limits.check() == "ok"  # the summary turn is offered once per run
    clock.now += 299
    assert limits.check() == "ok"
    assert limits.remaining == 1
    clock.now += 1
    assert limits.check() == "hard"
    assert limits.check() == "hard"
    assert limits.remaining == 0
    assert [e.name for e in events if isinstance(e, Observed)] == [
        "agent.exhaustion.soft_limit",
        "agent.exhaustion.hard_limit",
    ]


def test_hard_wins_when_soft_was_skipped() -> None:
    clock = FakeClock()
    limits = TimeLimits(soft=10, hard=20, clock=clock)
    limits.start()
    clock.now = 25
    assert limits.check() == "hard"


def test_check_starts_the_clock_and_start_restarts_it() -> None:
    clock = FakeClock(start=50)
    limits = TimeLimits(soft=10, hard=20, clock=clock)
    assert limits.elapsed == 0
    assert limits.check() == "ok"
    clock.now += 15
    assert limits.check() == "soft"
    limits.start()
    clock.now += 15
    assert limits.check() == "soft"


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="soft <= hard"):
        TimeLimits(soft=30, hard=10, clock=FakeClock())
