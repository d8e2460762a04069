"""`--since` of `parley usage` and `parley audit`: one reading of when a listing starts."""

from __future__ import annotations

import datetime as dt
import re
import time

from core.cost.report import period_start

SINCE_HELP = (
    "today, month, an age back from now (30m, 12h, 7d, 2w) or an ISO date or time "
    "(2026-11-01, 2026-11-01T09:30; UTC unless it says otherwise)"
)
_AGE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNIT = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """The start `--since` names, in seconds since the epoch.

    Raises:
        ValueError: `text` is none of the forms of `SINCE_HELP`.
    """
    now = time.time() if now is None else now
    value = text.strip()
    if value.lower() in ("today", "month"):
        return period_start(value.lower(), now)
    if match := _AGE.match(value.lower()):
        return now - int(match[1]) * _UNIT[match[2]]
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since {text!r} is not {SINCE_HELP}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


__all__ = ["SINCE_HELP", "parse_since"]
