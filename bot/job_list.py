"""`parley jobs list` and `parley jobs runs JOB`: the jobs, and every fire with its outcome."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING

from bot.app import open_configured_store
from bot.schedules import build_trigger, job_zone
from core.chat import is_silent
from core.config import JobConfig
from core.errors import ConfigError
from core.store import JobRunRecord, Store

if TYPE_CHECKING:
    from bot.app import App

RESULT_WIDTH = 50
FIRES_LISTED = 50


async def jobs_list(app: App, store: Store | None = None) -> str:
    """`parley jobs list`: name, schedule, next fire, last run, last result, delivered."""
    jobs = app.config.jobs
    if not jobs:
        return "No jobs are configured (add [[jobs]] to config.toml)."
    own = store is None
    if store is None:
        store = await open_configured_store(app.config.store, app.environ)
    try:
        now = datetime.now(UTC)
        rows = [await _list_row(store, job, now) for job in jobs]
    finally:
        if own:
            await store.aclose()
    header = ("name", "schedule", "next fire", "last run", "last result", "delivered")
    return _table(header, rows)


async def jobs_runs(app: App, name: str, store: Store | None = None) -> str:
    """`parley jobs runs JOB`: the job's latest fires, each with its outcome (running ones
    too: a fire whose worker died is taken over and finished by another)."""
    job = next((j for j in app.config.jobs if j.name == name), None)
    if job is None:
        known = ", ".join(f"`{j.name}`" for j in app.config.jobs) or "none"
        raise ConfigError("jobs", f"there is no job named `{name}`", f"configured jobs: {known}")
    own = store is None
    if store is None:
        store = await open_configured_store(app.config.store, app.environ)
    try:
        fires = await store.job_runs(name, FIRES_LISTED)
    finally:
        if own:
            await store.aclose()
    if not fires:
        return f"Job `{name}` has not fired yet."
    zone = _zone(job)
    header = ("fire", "state", "delivered", "run", "result")
    rows = [
        (
            _when(datetime.fromtimestamp(fire["fire_time"], UTC), zone),
            fire["state"],
            _delivered(fire),
            fire["run_id"] if not str(fire["run_id"] or "").startswith("claim:") else "",
            _result(fire, with_state=False),
        )
        for fire in fires
    ]
    return _table(header, [tuple(str(c or "") for c in row) for row in rows])


async def _list_row(store: Store, job: JobConfig, now: datetime) -> tuple[str, ...]:
    try:
        zone = job_zone(job.timezone)
        upcoming = build_trigger(job.schedule, zone).get_next_fire_time(None, now)
        next_fire = _when(upcoming, zone) if upcoming else "never"
    except ValueError as exc:
        zone, next_fire = UTC, f"invalid: {exc}"
    runs = await store.job_runs(job.name, 1)
    if not runs:
        return job.name, job.schedule, next_fire, "never", "", ""
    last = runs[0]
    fired = _when(datetime.fromtimestamp(last["fire_time"], UTC), zone)
    return job.name, job.schedule, next_fire, fired, _result(last), _delivered(last)


def _result(fire: JobRunRecord, *, with_state: bool = True) -> str:
    detail = " ".join(str(fire["error"] or fire["result"] or "").split())
    result = f"{fire['state']}: {detail}" if with_state and detail else detail or fire["state"]
    if len(result) > RESULT_WIDTH:
        result = result[: RESULT_WIDTH - 1] + "…"
    return result


def _delivered(fire: JobRunRecord) -> str:
    if fire["state"] == "running":
        return "…"
    if fire["delivered"]:
        return "yes"
    if fire["state"] == "completed" and is_silent(fire["result"] or ""):
        return "silent"
    return "no"


def _zone(job: JobConfig) -> tzinfo:
    try:
        return job_zone(job.timezone)
    except ValueError:
        return UTC


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


def _when(moment: datetime, zone: tzinfo) -> str:
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


__all__ = ["jobs_list", "jobs_runs"]
