"""Job schedules (docs/jobs.md): cron expressions, time zones, missed fires, targets.

Schedules are standard 5-field cron (`minute hour day month weekday`, 0 or 7 = Sunday),
or 6 fields with seconds first. Unlike classic cron, a restricted day-of-month and a
restricted weekday must BOTH match (APScheduler's rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from channels.platforms import PLATFORMS, target_examples
from core.errors import ConfigError

if TYPE_CHECKING:
    from bot.config import ParleyConfig
    from channels.base import Channel
    from channels.gate import AccessConfig

TARGET_TYPES = tuple(PLATFORMS)
TICK = timedelta(microseconds=1)
_CRON_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")


def job_zone(name: str) -> tzinfo:
    """The job's timezone. Raises ValueError for an unknown name."""
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone `{name}`") from exc


def build_trigger(schedule: str, zone: tzinfo) -> CronTrigger:
    """A trigger for a 5-field cron expression (6 fields: seconds first). Raises ValueError."""
    fields = schedule.split()
    if len(fields) not in (5, 6):
        raise ValueError(f"`{schedule}` has {len(fields)} fields; a cron expression has 5")
    second = fields.pop(0) if len(fields) == 6 else "0"
    minute, hour, day, month, weekday = fields
    return CronTrigger(
        second=second,
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=_weekdays(weekday),
        timezone=zone,
    )


def _weekdays(field: str) -> str:
    """Cron weekday numbers (0 and 7 = Sunday) as names: APScheduler 3 counts 0 as Monday."""
    names: list[str] = []
    for item in field.split(","):
        body, slash, step_text = item.partition("/")
        low_text, dash, high_text = body.partition("-")
        if body == "*" and not slash:
            return "*"
        if body == "*":
            low, high = 0, 6
        elif low_text.isdigit() and (not dash or high_text.isdigit()):
            low = int(low_text)
            high = int(high_text) if dash else (6 if slash else low)
        else:
            names.append(item)  # names (`mon-fri`): APScheduler reads those right
            continue
        step = int(step_text) if step_text.isdigit() else (1 if not slash else 0)
        if not (0 <= low <= high <= 7) or step < 1:
            raise ValueError(f"bad weekday `{item}` (0-7, Sunday is 0 or 7)")
        names.extend(_CRON_DAYS[day] for day in range(low, high + 1, step))
    return ",".join(dict.fromkeys(names))


def latest_fire(trigger: CronTrigger, after: datetime, now: datetime) -> datetime | None:
    """The latest fire time t of `trigger` with `after` < t <= `now`, or None.

    Binary search on "is there a fire in (s, now]": a few dozen trigger calls whatever
    the span, since cron fires fall on whole seconds."""

    def next_after(moment: datetime) -> datetime | None:
        fire: datetime | None = trigger.get_next_fire_time(None, moment + TICK)
        return fire

    def fires_by_now(moment: datetime) -> bool:
        fire = next_after(moment)
        return fire is not None and fire <= now

    low, high = after.astimezone(UTC), now.astimezone(UTC)
    if low >= high or not fires_by_now(low):
        return None
    while high - low > timedelta(seconds=1):  # a fire in (low, now]; none in (high, now]
        middle = low + (high - low) / 2
        if fires_by_now(middle):
            low = middle
        else:
            high = middle
    return next_after(low)


def fires_between(trigger: CronTrigger, after: datetime, now: datetime) -> list[datetime]:
    """Every fire time t of `trigger` with `after` < t <= `now`, oldest first (callers keep
    the span short: one per fire)."""
    fires: list[datetime] = []
    moment = after.astimezone(UTC)
    while (fire := trigger.get_next_fire_time(None, moment + TICK)) is not None and fire <= now:
        fires.append(fire)
        moment = fire
    return fires


def check_target(
    config: ParleyConfig, channels: Mapping[str, Channel], target: str, key: str, who: str
) -> None:
    """Check that `who` (a job, a trigger) can post to `target`: a platform that is enabled,
    running, and whose allowlist admits the channel. Raises ConfigError naming `key`."""

    def error(problem: str, fix: str) -> ConfigError:
        source = str(config.source) if config.source else None
        return ConfigError(key, problem, fix, source=source)

    found = parse_target(target)
    if found is None:
        raise error(f"{who}: `{target}` is not a delivery target", f"write {target_examples()}")
    kind, ident = found
    access: AccessConfig = getattr(config.channels, kind)
    if not access.enabled:
        raise error(
            f"{who} posts to {kind}, which is not enabled",
            f"set `channels.{kind}.enabled = true`, or point it at an enabled channel",
        )
    if kind not in channels:
        raise error(
            f"{who} posts to {kind}, which is not running",
            f"check the {kind} channel's start-up errors, or point it elsewhere",
        )
    if not access.open and ident not in access.allow_channels:
        raise error(
            f"{who} posts to {kind} `{ident}`, which the allowlist does not admit",
            f"add `{ident}` to `channels.{kind}.allow_channels`",
        )


def parse_target(target: str) -> tuple[str, str] | None:
    """`slack:C0123` → ("slack", "C0123"); None if it is not a known platform target."""
    kind, colon, ident = target.partition(":")
    if not colon or kind not in TARGET_TYPES or not ident or ident != ident.strip():
        return None
    return kind, ident
