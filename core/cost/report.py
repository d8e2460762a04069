"""Usage summed by user, channel, job, model, conversation, run or day (docs/cost.md#usage):
what `/usage` and `parley usage` show, as a table or as CSV for finance."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable
from typing import Literal

from core.records import record
from core.store.usage_rows import LlmCall

GroupBy = Literal["user", "channel", "job", "model", "conv", "run", "day"]
GROUPS: tuple[GroupBy, ...] = ("user", "channel", "job", "model", "conv", "run", "day")
NOBODY = "-"


@record(slots=True)
class Total:
    """The calls of one group: tokens, and cost in USD of those that could be priced."""

    key: str
    calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    unpriced: int = 0  # calls whose model has no price (not in `cost`)

    def add(self, call: LlmCall) -> None:
        self.calls += 1
        self.input_tokens += call.input_tokens
        self.cached_tokens += call.cached_tokens
        self.cache_write_tokens += call.cache_write_tokens
        self.output_tokens += call.output_tokens
        if call.cost is None:
            self.unpriced += 1
        else:
            self.cost += call.cost


def key_of(call: LlmCall, by: GroupBy) -> str:
    match by:
        case "user":
            return call.user_id or NOBODY
        case "channel":
            return call.channel or NOBODY
        case "job":
            return call.job or NOBODY
        case "model":
            return f"{call.provider}/{call.model}"
        case "conv":
            return call.conv
        case "run":
            return call.run_id or NOBODY
        case "day":
            return dt.datetime.fromtimestamp(call.at, dt.UTC).date().isoformat()


def summarize(calls: Iterable[LlmCall], by: GroupBy) -> list[Total]:
    """One total per group, the most expensive first; then the sum of all as "total"."""
    groups: dict[str, Total] = {}
    whole = Total("total")
    for call in calls:
        groups.setdefault(key_of(call, by), Total(key_of(call, by))).add(call)
        whole.add(call)
    rows = sorted(groups.values(), key=lambda t: (-t.cost, -t.calls, t.key))
    return [*rows, whole]


HEADER = ("calls", "input", "cached", "cache_write", "output", "cost_usd", "unpriced")


def _cells(total: Total) -> tuple[str, ...]:
    return (
        str(total.calls), str(total.input_tokens), str(total.cached_tokens),
        str(total.cache_write_tokens), str(total.output_tokens), f"{total.cost:.6f}",
        str(total.unpriced),
    )  # fmt: skip


def table(rows: list[Total], by: GroupBy) -> str:
    """An aligned text table, the total last."""
    lines = [(by, *HEADER), *((r.key, *_cells(r)) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER) + 1)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def csv_text(rows: list[Total], by: GroupBy) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((by, *HEADER))
    writer.writerows((r.key, *_cells(r)) for r in rows)
    return out.getvalue()


def period_start(period: str, now: float) -> float:
    """The start of `period` ("today" or "month", UTC) containing `now`."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).date()
    first = day.replace(day=1) if period == "month" else day
    return dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC).timestamp()


__all__ = ["GROUPS", "GroupBy", "Total", "csv_text", "period_start", "summarize", "table"]
