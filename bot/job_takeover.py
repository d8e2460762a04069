"""A scheduled fire whose worker died mid-run: never lost silently.

The fire was taken over (`Store.take_over_fires`: its worker is gone), so it is this
worker's to finish, once:

- its run had ended (only the post was missing): its answer (or failure notice) is posted;
- else, with `on_interrupt = "rerun"`: the run goes on where it stopped if that is safe
  (every side-effecting call it started had finished), or runs afresh if it never got
  going, and its answer is posted as any fire's;
- else (`report`, the default, or not safe to go on): the job's target is told that the
  fire was interrupted, with the job's name and slot, and the fire ends `timed_out`.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from bot.job_result import JobResult
from bot.schedules import job_zone
from core.agent.cronruns import resume_job
from core.agent.lane import RunReport
from core.config import JobConfig
from core.fence import Fence, entered
from core.store import JobRunRecord, RunRow
from core.tools.policy import ToolPolicy

if TYPE_CHECKING:
    from bot.app import App
    from core.agent import Agent

log = logging.getLogger(__name__)


class FireHost(Protocol):
    """What finishing a fire taken over needs of the scheduler (`bot.jobs.Scheduler`)."""

    app: App
    agent: Agent

    @property
    def jobs(self) -> list[JobConfig]: ...

    def holding(self, job: JobConfig, job_run: int) -> AbstractContextManager[Fence]: ...

    async def run_fire(self, job: JobConfig, fire_time: datetime) -> RunReport: ...

    async def conclude(
        self, job: JobConfig, fire_time: datetime, job_run: int, report: RunReport
    ) -> JobResult: ...

    async def record(
        self,
        job: JobConfig,
        fire_time: datetime,
        job_run: int,
        state: str,
        post: str,
        run_id: str | None,
        failure: str | None,
    ) -> JobResult: ...


def slot_text(job: JobConfig, fire_time: datetime) -> str:
    """The fire's slot as the job's schedule reads it: `2024-02-29 09:00 UTC`."""
    try:
        zone = job_zone(job.timezone)
    except ValueError:
        zone = UTC
    return fire_time.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z").replace(":00 ", " ", 1)


def interrupted_notice(job: JobConfig, fire_time: datetime, why: str) -> str:
    """What the job's target is told of a fire that is not run to its end."""
    return f"⚠ Job `{job.name}` ({slot_text(job, fire_time)}) was interrupted: {why}."


async def go_on_with_fire(scheduler: FireHost, fire: JobRunRecord) -> JobResult:
    """Finish fire `fire`, taken over (see the module doc)."""
    agent = scheduler.agent
    fire_time = datetime.fromtimestamp(fire["fire_time"], UTC)
    job = next((j for j in scheduler.jobs if j.name == fire["job"]), None)
    key = ("cron", fire["job"], str(int(fire["fire_time"])))
    runs = await agent.store.runs(conv=":".join(key), limit=5)
    run = runs[0] if runs else None
    if run is not None and _interrupted(run):
        agent.store.resume_run(run.id)  # the fire's run follows the fire: this worker's
    if job is None:  # no longer configured: nothing to post to
        await agent.store.finish_job_run(
            fire["id"],
            state="timed_out",
            run_id=run.id if run else None,
            result=None,
            delivered=False,
            error="interrupted; the job is no longer configured",
        )
        _end_run(scheduler, run)
        return JobResult(fire["job"], fire_time, "timed_out")
    agent.events.emit(
        "job.interrupted",
        {"job": job.name, "fire_time": fire_time.isoformat(), "on_interrupt": job.on_interrupt},
        run_id=run.id if run else None,
    )
    with scheduler.holding(job, fire["id"]) as fence, entered(fence):
        if run is not None and not _interrupted(run):  # it ended; only the post was missing
            report = await _ended(scheduler, run)
            return await scheduler.conclude(job, fire_time, fire["id"], report)
        why = "the worker running it stopped"
        if job.on_interrupt == "rerun":
            report = await _rerun(scheduler, job, fire_time, key, run)
            if report.stop_reason != "unsafe":
                return await scheduler.conclude(job, fire_time, fire["id"], report)
            why += f", and going on is not safe: {report.failure}"
        else:
            why += ' (on_interrupt = "report": it is not run again)'
        _end_run(scheduler, run)
        text = interrupted_notice(job, fire_time, why)
        run_id = run.id if run else None
        failure = f"interrupted: {why}"
        return await scheduler.record(
            job, fire_time, fire["id"], "timed_out", text, run_id, failure
        )


def _interrupted(run: RunRow) -> bool:
    """The fire's run was cut off (running, taken over; or left resumable by a crash)."""
    return run.state == "running" or (run.state == "timed_out" and run.resumable)


async def _ended(scheduler: FireHost, run: RunRow) -> RunReport:
    """The report of a fire's run that had ended, its full answer from the history."""
    report = RunReport.of_row(run)
    if report.state == "completed" and len(report.text) >= 2000:  # the row keeps a prefix
        messages = await scheduler.agent.store.load_messages(run.conv)
        answers = [m.content for m in messages if m.role == "assistant" and m.content]
        if answers:
            return RunReport(run.id, "completed", answers[-1], stop_reason=report.stop_reason)
    return report


async def _rerun(
    scheduler: FireHost,
    job: JobConfig,
    fire_time: datetime,
    key: tuple[str, str, str],
    run: RunRow | None,
) -> RunReport:
    """The fire goes on where its run stopped, if that is safe; afresh if it never got
    going (no checkpoint)."""
    agent, app = scheduler.agent, scheduler.app
    if run is None or await agent.store.last_checkpoint(run.id) is None:
        _end_run(scheduler, run)
        return await scheduler.run_fire(job, fire_time)
    provider = job.provider or app.default_provider
    policy = ToolPolicy(session="cron", allow_tools=frozenset(job.allow_tools))
    return await resume_job(
        agent,
        key,
        run.id,
        lambda journal: app.conversation(
            provider, journal, policy=policy, max_iterations=job.max_iterations
        ),
        provider,
    )


def _end_run(scheduler: FireHost, run: RunRow | None) -> None:
    """The fire's cut-off run (this worker's now) will not go on: it ends interrupted."""
    if run is not None and _interrupted(run):
        scheduler.agent.store.set_run_state(run.id, "timed_out", "interrupted", resumable=False)


__all__ = ["FireHost", "go_on_with_fire", "interrupted_notice", "slot_text"]
