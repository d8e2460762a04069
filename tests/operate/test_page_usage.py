"""Usage and cost per day on the operator's page (docs/operations.md#the-operators-page),
rendered from a real store's `llm_calls` rows: one bar per day of the last 30 (a well-formed
inline SVG, heights in proportion to the cost), the days' table newest first with the
total, the models' table — and a model name holding markup shown as text."""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bot.admin_usage import DAYS, usage_section
from core.store import LlmCall, open_store

NOW = dt.datetime(2026, 11, 26, 15, 0, tzinfo=dt.UTC).timestamp()
DAY = 86400.0
SVG = "{http://www.w3.org/2000/svg}"
HOSTILE_MODEL = "gpt-<script>alert(1)</script>&<b>x</b>"


def call(at: float, model: str, cost: float | None, tokens: tuple[int, int, int]) -> LlmCall:
    inp, cached, out = tokens
    return LlmCall(at, "r1", "test:c1:", "u1", "test", "", "fake", model, inp, cached, 0, out, cost)


async def test_the_chart_and_tables_show_each_days_cost(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "parley.db")
    try:
        store.record_llm_call(call(NOW - 60, HOSTILE_MODEL, 0.0125, (1000, 200, 50)))
        store.record_llm_call(call(NOW - 120, "fake-model", None, (10, 0, 5)))  # unpriced
        store.record_llm_call(call(NOW - 3 * DAY, "fake-model", 0.5, (40000, 0, 900)))
        store.record_llm_call(call(NOW - 40 * DAY, "fake-model", 9.0, (1, 0, 1)))  # too old
        await store.flush()
        section = await usage_section(store, NOW)
    finally:
        await store.aclose()

    svg = ET.fromstring(re.search(r"<svg.*?</svg>", section, re.S)[0])  # type: ignore[index]
    bars = svg.findall(f"{SVG}rect")
    assert len(bars) == DAYS
    tips = [bar.findtext(f"{SVG}title") for bar in bars]
    assert tips[-1] == "2026-11-26: $0.0125 (+1 unpriced), 2 calls"
    assert tips[-4] == "2026-11-23: $0.5000, 1 calls"
    assert tips[0] == "2026-10-28: $0.0000, 0 calls"
    heights = [float(bar.get("height", "")) for bar in bars]
    assert heights[-4] == max(heights)
    assert heights[-1] == pytest.approx(heights[-4] * 0.0125 / 0.5, abs=0.1)
    assert sum(1 for h in heights if h > 0) == 2  # the call 40 days ago is not drawn
    labels = [t.text for t in svg.findall(f"{SVG}text")]
    assert "$0.5000" in labels
    assert "2026-10-28" in labels
    assert "2026-11-26" in labels

    days_table = section[section.index("</svg>") : section.index("By model")]
    rows = re.findall(r"<tr>(.*?)</tr>", days_table)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]]
    assert cells == [
        ["2026-11-26", "2", "1,010", "200", "55", "$0.0125 (+1 unpriced)"],
        ["2026-11-23", "1", "40,000", "0", "900", "$0.5000"],
        ["<b>total</b>", "3", "41,010", "200", "955", "$0.5125 (+1 unpriced)"],
    ]
    models = section[section.index("By model") :]
    assert "<script>" not in section
    assert "fake/gpt-&lt;script&gt;alert(1)&lt;/script&gt;&amp;&lt;b&gt;x&lt;/b&gt;" in models


async def test_with_no_priced_call_the_bars_count_calls(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "parley.db")
    try:
        store.record_llm_call(call(NOW - 60, "fake-model", None, (10, 0, 5)))
        await store.flush()
        section = await usage_section(store, NOW)
    finally:
        await store.aclose()
    svg = ET.fromstring(re.search(r"<svg.*?</svg>", section, re.S)[0])  # type: ignore[index]
    assert svg.get("aria-label") == "LLM calls per day"
    assert "1 calls" in [t.text for t in svg.findall(f"{SVG}text")]


async def test_no_usage_yet(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "parley.db")
    try:
        section = await usage_section(store, NOW)
    finally:
        await store.aclose()
    svg = ET.fromstring(re.search(r"<svg.*?</svg>", section, re.S)[0])  # type: ignore[index]
    assert [float(b.get("height", "")) for b in svg.findall(f"{SVG}rect")] == [0.0] * DAYS
    assert section.count("<p class=muted>none</p>") == 2  # no days, no models
