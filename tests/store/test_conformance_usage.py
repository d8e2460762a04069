"""Priced usage and budgets on every backend (core/store/usage_rows.py `UsageStore`): calls
are kept and read back, a reservation is all or nothing, limits set with `/budget` hold
for every store, and two workers racing 100 calls against one budget overspend by at most
one reservation."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.cost.meter import Ledger, Who, periods
from core.cost.prices import PriceTable
from core.cost.settings import BudgetsConfig, ModelPrice
from core.errors import BudgetExceeded
from core.events import Usage
from core.store import LlmCall, Refused, Store
from tests.store.conftest import Reopen


def call(at: float, conv: str, cost: float | None) -> LlmCall:
    return LlmCall(at, "r1", conv, "slack:U1", "slack:C1", "", "p", "m", 100, 40, 10, 5, cost)


async def test_calls_are_kept_and_read_back(reopen: Reopen) -> None:
    store = await reopen()
    store.record_llm_call(call(1.0, "a", 0.25))
    store.record_llm_call(call(2.0, "b", None))
    store.record_llm_call(call(3.0, "a", 0.5))
    await store.aclose()
    store = await reopen()
    assert [c.cost for c in await store.llm_calls(0)] == [0.25, None, 0.5]
    assert [c.at for c in await store.llm_calls(2.0)] == [2.0, 3.0]
    assert [c.at for c in await store.llm_calls(0, conv="a")] == [1.0, 3.0]
    assert (await store.llm_calls(0))[0] == call(1.0, "a", 0.25)
    await store.aclose()


async def test_a_reservation_is_all_or_nothing(store: Store) -> None:
    assert await store.reserve_budget([("day", 0.6, 1.0), ("month", 0.6, 5.0)]) is None
    refused = await store.reserve_budget([("day", 0.6, 1.0), ("month", 0.6, 5.0)])
    assert refused == Refused("day", 0.6)
    assert await store.budget_spent(["day", "month", "never"]) == {"day": 0.6, "month": 0.6}
    store.settle_budget(["day", "month"], -0.35)  # it cost 0.25
    assert await store.reserve_budget([("day", 0.75, 1.0)]) is None  # exactly at the limit
    assert await store.budget_spent(["day"]) == {"day": 1.0}
    assert await store.reserve_budget([]) is None


async def test_limits_set_with_budget_hold_for_every_store(reopen: Reopen) -> None:
    one, two = await reopen(), await reopen()
    await one.set_budget_limit("per_user_day", 5.0, "slack:U1")
    await one.set_budget_limit("per_user_day", 7.5, "slack:U1")
    assert await two.budget_limits() == {"per_user_day": 7.5}
    await one.aclose()
    await two.aclose()


async def test_two_workers_racing_100_calls_overspend_by_at_most_one_reservation(
    reopen: Reopen,
) -> None:
    """Two stores (two workers' pools) on one database, 50 calls each at once, every call
    reserving its worst case and then settling what it cost."""
    prices = PriceTable({"m": ModelPrice(input=1000.0, output=1000.0)})  # $0.001 a token
    budgets = BudgetsConfig(total_month=1.0)
    worst = (100 + 50) / 1000  # prompt + max output
    stores = [await reopen(), await reopen()]
    meters = [
        Ledger(s, prices, budgets).for_run(Who(f"r{i}", "c", "", "", ""), lambda e: None)
        for i, s in enumerate(stores)
    ]
    done: list[float] = []

    async def one_call(n: int) -> None:
        meter = meters[n % 2]
        try:
            held = await meter.reserve("openai_chat", "m", 100, 50)
        except BudgetExceeded:
            return
        await asyncio.sleep(0)  # the call streams meanwhile
        cost = meter.settle(held, "p", "openai_chat", "m", Usage(100, 20 + n % 30))
        assert cost is not None
        done.append(cost)

    await asyncio.gather(*(one_call(n) for n in range(100)))
    for s in stores:
        await s.flush()
    [month] = [p.key for p in periods(Who("", "", "", "", ""), time.time())]
    [spent] = (await stores[0].budget_spent([month])).values()
    assert spent == pytest.approx(sum(done))  # every reservation became its real cost
    assert sum(done) <= 1.0 + worst  # at most one reservation over
    assert len(done) >= 1.0 // worst  # and the budget was used, not refused wholesale
    calls = await stores[1].llm_calls(0)
    assert len(calls) == len(done)
    for s in stores:
        await s.aclose()
