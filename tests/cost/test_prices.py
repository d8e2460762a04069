"""Priced usage (docs/cost.md#prices): a scripted session's cost equals the figure worked
out by hand from the price table, and is summed per run, conversation, user, channel and
day; `[prices]` overrides the table; `/usage` and `parley usage` show it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bot.usage import parse_since
from core.cost.prices import PriceTable
from core.cost.report import csv_text, summarize, table
from core.cost.settings import ModelPrice
from core.events import Usage
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

SONNET = "claude-sonnet-4-5"


def sonnet(fake_llm: FakeLLM) -> dict[str, object]:
    """The default provider as Anthropic's Sonnet 4.5, at the fake."""
    return {
        "fake": {
            "kind": "anthropic",
            "base_url": fake_llm.root_url,
            "model": SONNET,
            "api_key_env": "ANTHROPIC_KEY",
        }
    }


async def test_a_scripted_session_costs_what_the_price_table_says(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    # genai-prices, Claude Sonnet 4.5 under 200k tokens, USD per million tokens:
    # input 3.00, cache read 0.30, cache write 3.75, output 15.00.
    fake_llm.script(
        # 2,000 prompt tokens of which 1,500 written to the cache; 100 out:
        # 500 × 3 + 1,500 × 3.75 + 100 × 15 = 8,625 µ$
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})], usage=(2_000, 100),
              cache_write_tokens=1_500),
        # 2,300 prompt tokens: 1,500 read from the cache, 700 written, 100 plain; 50 out:
        # 100 × 3 + 1,500 × 0.30 + 700 × 3.75 + 50 × 15 = 4,125 µ$
        Reply(text="Two files.", usage=(2_300, 50), cached_tokens=1_500, cache_write_tokens=700),
        # the next turn, all of it from the cache but 10 tokens: 3,000 prompt, 20 out:
        # 10 × 3 + 2,990 × 0.30 + 20 × 15 = 1,227 µ$
        Reply(text="Still two.", usage=(3_000, 20), cached_tokens=2_990),
    )  # fmt: skip
    expected = (8_625 + 4_125 + 1_227) / 1_000_000
    async with running_agent(
        fake_llm, tmp_path, providers=sonnet(fake_llm), environ={"ANTHROPIC_KEY": "k"}
    ) as agent:
        chat = RecordingResponder()
        first = await agent.run(inbound("what is here?"), chat)
        second = await agent.run(inbound("and now?"), chat)
        await agent.store.flush()
        calls = await agent.store.llm_calls(0)
        assert [round(c.cost or 0, 9) for c in calls] == [0.008625, 0.004125, 0.001227]
        assert [(c.cached_tokens, c.cache_write_tokens) for c in calls] == [
            (0, 1_500),
            (1_500, 700),
            (2_990, 0),
        ]
        for by in ("conv", "user", "channel", "day", "model"):
            *groups, total = summarize(calls, by)  # type: ignore[arg-type]
            assert len(groups) == 1, by
            assert total.cost == pytest.approx(expected, abs=1e-12)
        runs = {t.key: t.cost for t in summarize(calls, "run")[:-1]}
        assert runs == pytest.approx({first.run_id: 0.01275, second.run_id: 0.001227})
        assert calls[0].user_id == "test:u1"
        assert calls[0].channel == "test:c1"
        assert calls[0].job == ""
        # the run's events carry each call's cache use and cost
        events = [
            d
            for _, name, _, d in await agent.store.events(first.run_id)
            if name == "agent.llm.call"
        ]
        assert [(e["cached_tokens"], e["cost_usd"]) for e in events] == [
            (0, 0.008625),
            (1_500, 0.004125),
        ]
        await agent.submit(inbound("/usage today"), chat)
        assert "All: $0.01 — 3 calls, 7,300 tokens in (61% from cache)" in chat.sent[-1]
        await agent.submit(inbound("/status"), chat)
        assert (
            "Prompt cache: 4,490 of 7,300 input tokens read from cache (61%), 2,200 written"
            in chat.sent[-1]
        )


async def test_prices_in_the_config_override_the_table(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="hi", usage=(1_000, 200), cached_tokens=400))
    prices = {"fake-model": {"input": 2.0, "cached": 0.5, "output": 8.0}}
    async with running_agent(fake_llm, tmp_path, prices=prices) as agent:
        await agent.run(inbound("hello"), RecordingResponder())
        await agent.store.flush()
        [call] = await agent.store.llm_calls(0)
    # 600 × 2 + 400 × 0.5 + 200 × 8 = 3,000 µ$
    assert call.cost == pytest.approx(0.003)


async def test_a_model_nobody_prices_is_recorded_without_a_cost(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """No budget set (the default): the call goes ahead, its tokens are kept, its cost is
    unknown — and says so in the report."""
    fake_llm.script(Reply(text="hi", usage=(10, 2)))
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound("hello"), RecordingResponder())
        await agent.store.flush()
        calls = await agent.store.llm_calls(0)
    assert report.text == "hi"
    assert [(c.cost, c.input_tokens) for c in calls] == [(None, 10)]
    [*_, total] = summarize(calls, "model")
    assert (total.unpriced, total.cost) == (1, 0.0)


def test_local_models_cost_nothing_and_cache_prices_default_to_input() -> None:
    table = PriceTable(
        {"llama3.1:8b": ModelPrice(input=0, output=0), "x": ModelPrice(input=1, output=1)}
    )
    assert table.price("llama3.1:8b", Usage(50_000, 1_000)) == 0
    assert table.price("x", Usage(1_000_000, 0, False, 500_000, 0)) == pytest.approx(1.0)
    assert table.price("no-such-model-anywhere", Usage(1, 1)) is None


def test_the_report_as_a_table_and_as_csv(tmp_path: Path) -> None:
    from core.store import LlmCall

    at = dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC).timestamp()
    calls = [
        LlmCall(at, "r1", "slack:C1:1", "slack:U1", "slack:C1", "", "p", "m1", 100, 50, 0, 10, 0.5),
        LlmCall(at, "r2", "cron:daily:1", "", "", "daily", "p", "m2", 100, 0, 0, 10, 0.25),
        LlmCall(at, "r3", "cron:daily:2", "", "", "daily", "p", "m3", 100, 0, 0, 10, None),
    ]
    rows = summarize(calls, "job")
    assert csv_text(rows, "job").splitlines() == [
        "job,calls,input,cached,cache_write,output,cost_usd,unpriced",
        "-,1,100,50,0,10,0.500000,0",
        "daily,2,200,0,0,20,0.250000,1",
        "total,3,300,50,0,30,0.750000,1",
    ]
    lines = table(rows, "job").splitlines()
    assert lines[0].split() == [
        "job",
        "calls",
        "input",
        "cached",
        "cache_write",
        "output",
        "cost_usd",
        "unpriced",
    ]
    assert lines[-1].split() == ["total", "3", "300", "50", "0", "30", "0.750000", "1"]
    now = dt.datetime(2026, 11, 26, 9, tzinfo=dt.UTC).timestamp()
    assert parse_since("month", now) == dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
    assert parse_since("7d", now) == now - 7 * 86400
    assert parse_since("2026-11-20", now) == dt.datetime(2026, 11, 20, tzinfo=dt.UTC).timestamp()
    with pytest.raises(ValueError, match="--since 'last week'"):
        parse_since("last week", now)


def test_the_price_table_reads_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled snapshot: pricing a model never starts genai-prices' updater."""
    import genai_prices.update_prices as updater

    def no_fetch(*args: object, **kwargs: object) -> None:
        raise AssertionError("genai-prices tried to fetch prices")

    monkeypatch.setattr(updater.UpdatePrices, "fetch", no_fetch)
    assert PriceTable().price(SONNET, Usage(1_000, 0), "anthropic") == pytest.approx(0.003)
    assert json.dumps(PriceTable().price("gpt-4o", Usage(1_000_000, 0))) == "2.5"
