"""The scheduler taken over by another worker (docs/scale-out.md): the successor runs every fire
of the takeover window that nobody claimed, and coalesces older missed fires into their
latest, as a restart does; a restart alone still runs only the latest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.schedules import build_trigger, fires_between
from tests.fakes.llm import FakeLLM, Reply
from tests.test_jobs import T2024, job, scheduler

# Every hour of Feb 29: 2024's are injected, and the real scheduler has none before 2028.
HOURLY_LEAP = "0 * 29 2 *"
HOUR = timedelta(hours=1)


async def fired(fake_llm: FakeLLM, state: Path, takeover: float | None) -> list[datetime]:
    """The fire times claimed when a worker starts at 05:01, the last fire being 00:00."""
    fake_llm.responder = lambda request: Reply(text="Report.")
    jobs = [job(schedule=HOURLY_LEAP, misfire_grace_seconds=24 * 3600)]
    async with scheduler(fake_llm, state, jobs) as (sched, _, _a):
        await sched.fire(sched.job("report"), T2024)
    now = T2024 + 5 * HOUR + timedelta(minutes=1)
    async with scheduler(fake_llm, state, jobs, now=now) as (sched, chan, agent):
        await sched.start(takeover=takeover)
        await sched.wait_idle()
        runs = await agent.store.job_runs("report", 100)
        assert len(chan.posts()) == len(runs) - 1  # each new fire posted once
    return sorted(datetime.fromtimestamp(r["fire_time"], UTC) for r in runs)


async def test_a_takeover_runs_every_fire_of_its_window_and_coalesces_older_ones(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fires = await fired(fake_llm, tmp_path, takeover=3 * 3600)
    hours = [T2024 + n * HOUR for n in (0, 2, 3, 4, 5)]  # 01:00 coalesced into 02:00
    assert fires == hours


async def test_a_restart_still_runs_only_the_latest_missed_fire(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    assert await fired(fake_llm, tmp_path, takeover=None) == [T2024, T2024 + 5 * HOUR]


def test_fires_between_lists_every_fire_oldest_first() -> None:
    trigger = build_trigger("*/20 * * * * *", UTC)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    fires = fires_between(trigger, start, start + timedelta(minutes=1))
    assert fires == [start + timedelta(seconds=s) for s in (20, 40, 60)]
    assert fires_between(trigger, start, start) == []
