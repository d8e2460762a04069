"""Usage and cost per day on the operator's page (docs/operations.md#the-operators-page):
the last `DAYS` days (UTC) as an inline SVG bar chart — drawn on the server, no script
and no `style=`, so the page's Content-Security-Policy (`bot.admin_html.CSP`) holds —
with a table of the days beside it and one of the models below. The sums are `parley usage`'s own
(`core.cost.report.summarize` over `UsageStore.llm_calls`, docs/cost.md#usage)."""

from __future__ import annotations

import datetime as dt

from bot.admin_html import e, table
from core.cost.report import Total, summarize
from core.store import UsageStore

DAYS = 30  # days on the chart, today (UTC) the last
WIDTH, HEIGHT = 620, 180  # the chart's box, in pixels
LEFT, BOTTOM, TOP = 64, 22, 14  # room for the axis labels
COUNTS = ("calls", "input", "cached", "output")


def days(now: float) -> list[str]:
    """The chart's days, oldest first, as `summarize(…, "day")` keys them."""
    today = dt.datetime.fromtimestamp(now, dt.UTC).date()
    return [(today - dt.timedelta(days=DAYS - 1 - i)).isoformat() for i in range(DAYS)]


def start_of(day: str) -> float:
    first = dt.date.fromisoformat(day)
    return dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC).timestamp()


def money(total: Total) -> str:
    if total.calls and total.unpriced == total.calls:
        return "unpriced"
    text = f"${total.cost:.4f}"
    return f"{text} (+{total.unpriced} unpriced)" if total.unpriced else text


def _counts(total: Total) -> list[str]:
    return [
        e(f"{n:,}")
        for n in (total.calls, total.input_tokens, total.cached_tokens, total.output_tokens)
    ]


async def usage_section(store: UsageStore, now: float) -> str:
    """The chart, the days' table and the models' table of the last `DAYS` days."""
    shown = days(now)
    calls = await store.llm_calls(start_of(shown[0]))
    *by_day, whole = summarize(calls, "day")
    totals = {t.key: t for t in by_day}
    chart = bar_chart([(day, totals.get(day, Total(day))) for day in shown])
    day_rows = [[e(t.key), *_counts(t), e(money(t))] for t in sorted(by_day, key=lambda t: t.key)]
    day_rows.reverse()  # the newest first
    if by_day:
        day_rows.append(["<b>total</b>", *_counts(whole), e(money(whole))])
    *by_model, _ = summarize(calls, "model")
    model_rows = [[e(t.key), *_counts(t), e(money(t))] for t in by_model]
    return (
        f"<div class=usage>{chart}"
        + table(["day (UTC)", *COUNTS, "cost (USD)"], day_rows, numeric_from=1)
        + "</div><h3>By model (the same days)</h3>"
        + table(["model", *COUNTS, "cost (USD)"], model_rows, numeric_from=1)
    )


def bar_chart(series: list[tuple[str, Total]]) -> str:
    """One bar per day: its cost, or — when no call of the days was priced — its calls.
    Each bar's `<title>` (a tooltip) names the day, its cost and its calls."""
    priced = any(t.cost > 0 for _, t in series)
    values = [t.cost if priced else float(t.calls) for _, t in series]
    top = max(values, default=0.0) or 1.0
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    step = plot_w / max(len(series), 1)

    def label(v: float) -> str:
        return f"${v:.4f}" if priced else f"{v:.0f} calls"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{e("cost per day" if priced else "LLM calls per day")}">',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="#999"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 4}" font-size="10" text-anchor="end">'
        f"{e(label(top))}</text>",
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" font-size="10" text-anchor="end">'
        f"{e(label(0))}</text>",
    ]
    for i, ((day, total), value) in enumerate(zip(series, values, strict=True)):
        height = plot_h * value / top
        x, y = LEFT + i * step + 1, TOP + plot_h - height
        tip = f"{day}: {money(total)}, {total.calls} calls"
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{height:.1f}" fill="#4a7bd0"><title>{e(tip)}</title></rect>'
        )
    if series:
        for day, anchor, x in (
            (series[0][0], "start", LEFT),
            (series[-1][0], "end", LEFT + plot_w),
        ):
            parts.append(
                f'<text x="{x:.0f}" y="{HEIGHT - 6}" font-size="10" text-anchor="{anchor}">'
                f"{e(day)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["DAYS", "bar_chart", "days", "usage_section"]
