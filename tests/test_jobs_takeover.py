"""The scheduler taken over by another worker (docs/scale-out.md): the successor runs every fire
of the takeover window that nobody claimed, and coalesces older missed fires into their
latest, as a restart does; a restart alone still runs only the latest. A fire a crash cut
off is finished after the restart, never left running (issue 23; several workers:
tests/test_takeover_processes.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.schedules import build_trigger, fires_between
from core.messages import Message
from core.store import Checkpoint, open_store
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


async def crashed_fire(state: Path, name: str) -> None:
    """What a process killed during `name`'s fire of T2024 leaves: the fire claimed and
    running, its run interrupted after its input checkpoint (as start-up reconcile marks
    it)."""
    async with await open_store(state / "parley.db") as store:
        fire = await store.claim_job_fire(name, T2024.timestamp())
        assert fire is not None
        run_id, conv = f"run{name}", f"cron:{name}:{int(T2024.timestamp())}"
        store.save_messages(conv, [Message.system("s"), Message.user("Write the status report.")])
        await store.create_run(run_id, conv, "cron")
        store.checkpoint(Checkpoint(run_id, 1, "input", 0, 1, 2, "hash", (), 0.0))
        store.set_run_state(run_id, "timed_out", "interrupted", resumable=True)


async def test_a_fire_a_crash_left_running_is_gone_on_with_or_reported_after_a_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda request: Reply(text="Report.")
    await crashed_fire(tmp_path, "again")
    await crashed_fire(tmp_path, "tell")
    jobs = [
        job(name="again", on_interrupt="rerun", misfire_grace_seconds=60),
        job(name="tell", misfire_grace_seconds=60),
    ]
    async with scheduler(fake_llm, tmp_path, jobs) as (sched, chan, agent):
        await agent.reconcile()
        await sched.take_over_fires()
        await sched.wait_idle()
        again, tell = [(await agent.store.job_runs(name))[0] for name in ("again", "tell")]
        await sched.take_over_fires()  # each fire is finished once
        await sched.wait_idle()
        posts = chan.posts()
    assert len(posts) == 2
    assert "Report." in posts  # the rerun's answer: its run went on from its checkpoint
    [told] = [p for p in posts if p != "Report."]
    assert told.startswith("⚠ Job `tell` (2024-02-29 00:00 UTC) was interrupted")
    assert (again["state"], again["run_id"], again["delivered"]) == ("completed", "runagain", True)
    assert (tell["state"], tell["run_id"], tell["delivered"]) == ("timed_out", "runtell", True)
    [asked] = fake_llm.requests  # the rerun went on from its history, the prompt once
    assert [m["content"] for m in asked.json["messages"] if m["role"] == "user"] == [
        "Write the status report."
    ]
