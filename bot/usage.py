"""`parley usage [--by user|channel|job|model|day] [--since …] [--csv]`: what LLM calls
cost, summed from the store (docs/cost.md#usage)."""

from __future__ import annotations

import datetime as dt
import re
import sys
import time
from collections.abc import Mapping

from bot.app import open_configured_store
from bot.config import ParleyConfig
from core.cost.report import GroupBy, csv_text, period_start, summarize, table

SINCE_HELP = "today, month, a date (2026-11-01) or a span back from now (7d, 12h)"
_SPAN = re.compile(r"^(\d+)([dh])$")


def parse_since(text: str, now: float) -> float:
    """The start `--since` names, in seconds since the epoch (UTC).

    Raises:
        ValueError: `text` is none of the forms of `SINCE_HELP`.
    """
    value = text.strip().lower()
    if value in ("today", "month"):
        return period_start(value, now)
    if match := _SPAN.match(value):
        hours = int(match[1]) * (24 if match[2] == "d" else 1)
        return now - hours * 3600
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since {text!r} is not {SINCE_HELP}") from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


async def usage_command(
    config: ParleyConfig, by: GroupBy, since: str, as_csv: bool, environ: Mapping[str, str]
) -> int:
    try:
        start = parse_since(since, time.time())
    except ValueError as exc:
        sys.stderr.write(f"parley: {exc}\n")
        return 2
    path = config.store.resolved()
    if config.store.backend() == "sqlite" and not path.exists():
        sys.stdout.write(f"No usage yet ({path} does not exist).\n")
        return 0
    store = await open_configured_store(config.store, environ)
    try:
        rows = summarize(await store.llm_calls(start), by)
    finally:
        await store.aclose()
    sys.stdout.write(csv_text(rows, by) if as_csv else table(rows, by) + "\n")
    return 0


__all__ = ["parse_since", "usage_command"]
