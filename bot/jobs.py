"""Scheduled jobs (docs/jobs.md): `[[jobs]]` fired by APScheduler as cron sessions.

A fire is named by its scheduled time and claimed in the store before it runs
(`Store.claim_job_fire`), so neither a restart nor a duplicate trigger runs it twice. At
start-up the latest fire missed while Parley was down runs once, if it is within the
job's misfire grace (coalesced: only the latest). Each fire runs in its own lane under the
cron policy (write tools only if listed, admin tools blocked unless listed, no approvals)
and posts its answer — or a short failure notice — to the job's target; it counts as
delivered only when the platform accepted the post. A fire is its worker's while it runs:
one whose worker dies (or that a crash cut off) is taken over and finished by another
worker (after the restart), per the job's `on_interrupt` (`bot.job_takeover`).

Schedules are standard 5-field cron (`minute hour day month weekday`, 0 or 7 = Sunday),
or 6 fields with seconds first. Unlike classic cron, a restricted day-of-month and a
restricted weekday must BOTH match (APScheduler's rule).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from bot.job_list import jobs_list, jobs_runs
from bot.job_result import JobResult, failure_notice
from bot.job_takeover import go_on_with_fire
from bot.schedules import (
    TICK,
    build_trigger,
    check_target,
    fires_between,
    job_zone,
    latest_fire,
    parse_target,
)
from core.agent.cronruns import holding_fire, run_job
from core.agent.lane import RunReport
from core.chat import is_silent
from core.config import JobConfig
from core.errors import ConfigError, DeliveryFailed
from core.fence import Fence, entered
from core.tools.policy import ToolPolicy

if TYPE_CHECKING:
    from bot.app import App
    from channels.base import Channel
    from core.agent import Agent

log = logging.getLogger(__name__)

FIRES_SEARCHED = 100  # a fire's own row is among its job's latest ones


# --- the scheduler -------------------------------------------------------------------------


class Scheduler:
    """Fires the configured jobs; one per process, started after the channels.

    Args:
        app: the application (config, providers, conversations).
        agent: the running agent (its store records fires; its lanes run them).
        channels: the running channels by type (`slack`, …): where reports are posted.
        now: the clock for catch-up and fire times (tests inject one); default UTC now.
    """

    def __init__(
        self,
        app: App,
        agent: Agent,
        channels: Mapping[str, Channel],
        *,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.app, self.agent, self.channels = app, agent, channels
        self.now = now or (lambda: datetime.now(UTC))
        self._triggers: dict[str, CronTrigger] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[JobResult]] = set()
        self._aps: AsyncIOScheduler | None = None

    @property
    def jobs(self) -> list[JobConfig]:
        return self.app.config.jobs

    def job(self, name: str) -> JobConfig:
        """The job called `name`. Raises ConfigError if there is none."""
        for job in self.jobs:
            if job.name == name:
                return job
        known = ", ".join(f"`{j.name}`" for j in self.jobs) or "none"
        raise self._error("jobs", f"there is no job named `{name}`", f"configured jobs: {known}")

    # --- validation ---------------------------------------------------------------------

    def validate(self) -> None:
        """Check every job. Raises ConfigError naming the first bad job and its key."""
        seen: set[str] = set()
        for index, job in enumerate(self.jobs):
            if job.name in seen:
                raise self._error(
                    f"jobs.{index}.name",
                    f"job `{job.name}`: an earlier job has the same name",
                    "give every job its own name",
                )
            seen.add(job.name)
            self.check(job, index)

    def check(self, job: JobConfig, index: int | None = None) -> CronTrigger:
        """Check one job (schedule, timezone, target) and keep its trigger."""
        at = f"jobs.{self.jobs.index(job) if index is None else index}"
        try:
            zone = job_zone(job.timezone)
        except ValueError as exc:
            raise self._error(
                f"{at}.timezone",
                f"job `{job.name}`: {exc}",
                "use an IANA name such as `UTC` or `Europe/Berlin`",
            ) from exc
        try:
            trigger = build_trigger(job.schedule, zone)
        except ValueError as exc:
            raise self._error(
                f"{at}.schedule",
                f"job `{job.name}`: not a valid cron expression: {exc}",
                "use `minute hour day month weekday`, e.g. `0 9 * * 1-5` (6 fields: seconds first)",
            ) from exc
        self._check_target(job, f"{at}.channel")
        self._triggers[job.name] = trigger
        return trigger

    def _check_target(self, job: JobConfig, key: str) -> None:
        check_target(self.app.config, self.channels, job.channel, key, f"job `{job.name}`")

    def _error(self, key: str, problem: str, fix: str) -> ConfigError:
        source = self.app.config.source
        return ConfigError(key, problem, fix, source=str(source) if source else None)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self, *, takeover: float | None = None) -> None:
        """Validate, start each job's missed fire (if any) in the background, then
        schedule. Raises ConfigError for a bad job.

        `takeover` (seconds; several workers): this worker takes over from one that may
        have just died, so every fire of the last `takeover` seconds that nobody claimed
        runs (a failover loses no fire within the grace); earlier missed fires are
        coalesced into their latest, as after a restart."""
        self.validate()
        now = self.now()
        for job in self.jobs:
            for missed in await self._missed_fires(job, now, takeover):
                log.info("job %s: running the fire missed at %s", job.name, missed)
                self._spawn(job, missed)
        aps = AsyncIOScheduler(timezone=UTC)
        for job in self.jobs:
            aps.add_job(
                self._due,
                trigger=self._triggers[job.name],
                args=(job.name,),
                id=job.name,
                name=f"job {job.name}",
                coalesce=True,
                misfire_grace_time=job.misfire_grace_seconds,
                max_instances=1,
            )
        aps.start()
        self._aps = aps

    async def _missed_fires(
        self, job: JobConfig, now: datetime, takeover: float | None
    ) -> list[datetime]:
        """The latest fire after the stored last fire, if within the misfire grace, and
        with `takeover` every fire of its last seconds. A job that never fired has
        nothing to catch up."""
        last = await self.agent.store.job_last_fire(job.name)
        if last is None:
            return []
        trigger = self._triggers[job.name]
        grace_start = now - timedelta(seconds=job.misfire_grace_seconds) - TICK
        after = max(datetime.fromtimestamp(last, UTC), grace_start)
        recent = now if takeover is None else max(after, now - timedelta(seconds=takeover))
        older = latest_fire(trigger, after, recent)
        return ([older] if older else []) + fires_between(trigger, recent, now)

    async def hold(self, takeover: float) -> None:
        """The scheduler as a leased singleton (several workers, docs/scale-out.md): it fires
        while this worker holds the `scheduler` lease, catching up what a predecessor
        missed (see `start`). Cancelled when the lease is lost or at shutdown, it stops
        scheduling at once; fires already claimed finish (`shutdown` waits for them)."""
        await self.start(takeover=takeover)
        try:
            await asyncio.Event().wait()
        finally:
            aps, self._aps = self._aps, None
            if aps is not None and aps.running:
                aps.shutdown(wait=False)

    async def _due(self, name: str) -> None:
        """APScheduler's callback: fire the scheduled time that just came due."""
        job = self.job(name)
        now = self.now()
        grace_start = now - timedelta(seconds=job.misfire_grace_seconds) - TICK
        fire_time = latest_fire(self._triggers[name], grace_start, now)
        if fire_time is None:
            log.warning("job %s came due with no scheduled time in its grace window", name)
            return
        # Waiting (not awaiting) leaves the fire to us if APScheduler cancels this callback.
        await asyncio.wait({self._spawn(job, fire_time)})

    def _spawn(self, job: JobConfig, fire_time: datetime) -> asyncio.Task[JobResult]:
        task = asyncio.create_task(self.fire(job, fire_time), name=f"job {job.name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[JobResult]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("job fire crashed", exc_info=exc)

    async def wait_idle(self) -> None:
        """Until no fire is running (tests; catch-up fires run in the background)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def shutdown(self, grace: float = 30.0) -> None:
        """Stop firing; let running fires finish (up to `grace` seconds), cancel the rest."""
        aps, self._aps = self._aps, None
        if aps is not None and aps.running:
            aps.pause()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        if aps is not None and aps.running:
            aps.shutdown(wait=False)
            await asyncio.sleep(0)  # APScheduler shuts down in a loop callback

    # --- one fire -----------------------------------------------------------------------

    async def fire(self, job: JobConfig, fire_time: datetime) -> JobResult:
        """Run `job` for its scheduled `fire_time` (aware) once, post the result, record it.
        A fire already claimed (before a restart, or by a duplicate trigger) is skipped."""
        store, events = self.agent.store, self.agent.events
        async with self._locks.setdefault(job.name, asyncio.Lock()):
            job_run = await store.claim_job_fire(job.name, fire_time.timestamp())
            data: dict[str, Any] = {"job": job.name, "fire_time": fire_time.isoformat()}
            if job_run is None:
                events.emit("job.skipped", data)
                return JobResult(job.name, fire_time, "skipped", error="this fire already ran")
            events.emit("job.started", data)
            with self.holding(job, job_run) as fence, entered(fence):
                try:
                    report = await self.run_fire(job, fire_time)
                except asyncio.CancelledError:
                    await store.finish_job_run(
                        job_run,
                        state="cancelled",
                        run_id=None,
                        result=None,
                        delivered=False,
                        error="interrupted: Parley stopped",
                    )
                    raise
                except Exception as exc:
                    log.exception("job %s could not run", job.name)
                    failure = f"{type(exc).__name__}: {exc}"
                    report = RunReport("", "failed", failure, failure=failure)
                if fence.lost or report.stop_reason == "taken_over":
                    # another worker took this fire over (this one was taken for dead): it
                    # goes on with it or reports it, and records it
                    return JobResult(job.name, fire_time, "taken_over", run_id=report.run_id)
                return await self.conclude(job, fire_time, job_run, report)

    def holding(self, job: JobConfig, job_run: int) -> AbstractContextManager[Fence]:
        """The fence of fire `job_run`: its post goes out only while it is this worker's."""
        store, workers = self.agent.store, self.agent.workers
        me = workers.id if workers is not None else None

        async def still_mine() -> bool:
            return any(
                r["id"] == job_run and r["state"] == "running" and r["worker"] == me
                for r in await store.job_runs(job.name, FIRES_SEARCHED)
            )

        return holding_fire(self.agent, f"fire {job_run}", still_mine)

    async def conclude(
        self, job: JobConfig, fire_time: datetime, job_run: int, report: RunReport
    ) -> JobResult:
        """Post what fire `job_run` came to (its answer, or a short failure notice) to the
        job's target, and record it."""
        state, text, run_id = report.state, report.text, report.run_id or None
        reason = report.failure or text
        failed = state != "completed"
        post = failure_notice(job.name, state, reason) if failed else text
        return await self.record(
            job, fire_time, job_run, state, post, run_id, reason if failed else None
        )

    async def record(
        self,
        job: JobConfig,
        fire_time: datetime,
        job_run: int,
        state: str,
        post: str,
        run_id: str | None,
        failure: str | None,
    ) -> JobResult:
        """Post `post` to the job's target and record how fire `job_run` ended."""
        delivered, delivery_error = await self._deliver(job, post)
        error = "; ".join(e for e in (failure, delivery_error) if e) or None
        await self.agent.store.finish_job_run(
            job_run,
            state=state,
            run_id=run_id,
            result=post[:500],
            delivered=delivered,
            error=error[:500] if error else None,
        )
        data = {"job": job.name, "fire_time": fire_time.isoformat()}
        self.agent.events.emit("job.finished", {**data, "state": state, "delivered": delivered})
        return JobResult(job.name, fire_time, state, post, delivered, error, run_id)

    async def take_over_fires(self) -> None:
        """`core.agent.workers.CronTakeover`: the fires whose worker died (or, in one
        process, that a crash left running) are taken over and gone on with in the
        background: resumed or reported, per the job's `on_interrupt`."""
        agent = self.agent
        me = agent.workers.id if agent.workers is not None else None
        for fire in await agent.store.take_over_fires(me, claimed_before=agent.started_at):
            task = asyncio.create_task(go_on_with_fire(self, fire), name=f"fire {fire['id']}")
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    async def run_fire(self, job: JobConfig, fire_time: datetime) -> RunReport:
        """One cron session in a fresh lane, pinned to the job's policy and limits."""
        app = self.app
        key = ("cron", job.name, str(int(fire_time.timestamp())))
        provider = job.provider or app.default_provider
        policy = ToolPolicy(session="cron", allow_tools=frozenset(job.allow_tools))
        app.refresh()  # configuration files edited since the last turn are read first
        return await run_job(
            self.agent,
            key,
            job.prompt,
            lambda journal: app.conversation(
                provider, journal, policy=policy, max_iterations=job.max_iterations
            ),
            provider,
        )

    async def _deliver(self, job: JobConfig, text: str) -> tuple[bool, str | None]:
        """Post `text` to the job's target: (accepted by the platform, why not)."""
        if is_silent(text):
            return False, None  # the model chose to stay quiet: nothing to post
        target = parse_target(job.channel)
        channel = self.channels.get(target[0]) if target else None
        if target is None or channel is None:
            return False, f"no running channel for `{job.channel}`"
        try:
            await channel.responder((target[0], target[1], "")).send(text)
        except DeliveryFailed as exc:
            log.warning("job %s: the post was not delivered: %s", job.name, exc)
            return False, f"not delivered: {exc}"
        except Exception as exc:
            log.warning("job %s: posting failed", job.name, exc_info=True)
            return False, f"not delivered: {type(exc).__name__}: {exc}"
        return True, None


# --- `parley jobs` ------------------------------------------------------------------------


async def jobs_run(app: App, agent: Agent, channels: Mapping[str, Channel], name: str) -> JobResult:
    """`parley jobs run NAME`: fire the job now, under the same policy, and post the result.
    Raises ConfigError for an unknown name or a bad job."""
    scheduler = Scheduler(app, agent, channels)
    job = scheduler.job(name)
    scheduler.check(job)
    return await scheduler.fire(job, scheduler.now().replace(microsecond=0))


__all__ = [
    "JobResult",
    "Scheduler",
    "build_trigger",
    "failure_notice",
    "jobs_list",
    "jobs_run",
    "jobs_runs",
    "latest_fire",
    "parse_target",
]
