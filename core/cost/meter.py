"""Metering LLM calls (docs/cost.md#budgets): before each call its worst case (the prompt
plus the most output it may produce, at the model's price, without cache discounts) is
reserved against every budget that applies; after it, the reservation becomes the real
cost and the call is recorded with its usage.

The reservation is one store transaction (`UsageStore.reserve_budget`): atomic across
workers on PostgreSQL, across lanes and processes on SQLite. Since a call never costs
more than its reservation, spend never passes a limit; a process killed mid-call leaves
its reservation counted (never less than was spent).

`Ledger` is the application's (one store, one price table, the `[budgets]`);
`RunMeter` is one run's: who its calls are for and which budget periods they count
against. Budget refusals and changes go to `on_event` (the event log; an audit log can
hook in there).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from core.chat import Asker
from core.cost.prices import PriceTable
from core.cost.settings import BUDGET_NAMES, BudgetsConfig
from core.errors import BudgetExceeded
from core.events import EventSink, Observed, Usage
from core.records import record
from core.store.usage_rows import LlmCall, UsageStore
from core.triggers.kinds import THREAD_CHANNEL

BudgetEvent = Callable[[str, dict[str, Any]], None]
"""Told of each budget refusal ("budget.refused") and change ("budget.changed")."""


@record(frozen=True, slots=True)
class Who:
    """Whom a run's calls are for: the budgets and the usage report group by these."""

    run_id: str
    conv: str
    user: str  # "slack:U123", "" for nobody (a cron job)
    channel: str  # "slack:C0123", "" for a cron job
    job: str  # the cron job's name, or `trigger:<name>` for a trigger's run, else ""

    @classmethod
    def of(cls, run_id: str, conv: str, asker: Asker | None) -> Who:
        if asker is None:
            return cls(run_id, conv, "", "", "")
        if asker.channel == "cron":
            return cls(run_id, conv, "", "", asker.channel_id)
        if asker.channel == THREAD_CHANNEL and not asker.user_id:  # a trigger's run
            return cls(run_id, conv, "", "", f"trigger:{asker.channel_id}")
        user = f"{asker.channel}:{asker.user_id}" if asker.user_id else ""
        return cls(run_id, conv, user, f"{asker.channel}:{asker.channel_id}", "")


@record(frozen=True, slots=True)
class Period:
    """One budget's current period for a run: its store key and when it resets."""

    budget: str
    key: str
    resets: str  # for a person: "2026-11-27 00:00 UTC", "the next run"


def periods(who: Who, now: float) -> list[Period]:
    """Every budget period `who`'s calls count against at `now` (UTC days and months)."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).date()
    tomorrow = day + dt.timedelta(days=1)
    month = day.strftime("%Y-%m")
    next_month = (day.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    found = [Period("total_month", f"total_month:{month}", f"{next_month} 00:00 UTC")]
    if who.user:
        key = f"per_user_day:{who.user}:{day}"
        found.append(Period("per_user_day", key, f"{tomorrow} 00:00 UTC"))
    if who.channel:
        key = f"per_channel_month:{who.channel}:{month}"
        found.append(Period("per_channel_month", key, f"{next_month} 00:00 UTC"))
    if who.job:
        found.append(Period("per_job_run", f"per_job_run:{who.run_id}", "the job's next run"))
    if who.job.startswith("trigger:"):  # the budget scope `trigger:<name>`
        key = f"per_trigger_day:{who.job}:{day}"
        found.append(Period("per_trigger_day", key, f"{tomorrow} 00:00 UTC"))
    return found


@record(frozen=True, slots=True)
class Reservation:
    """What one call holds: `amount` USD in each of `keys` (nothing when no budget is set)."""

    keys: tuple[str, ...]
    amount: float


NOTHING = Reservation((), 0.0)


class Ledger:
    """The application's metering: prices, `[budgets]` and the store they are kept in."""

    def __init__(
        self,
        store: UsageStore,
        prices: PriceTable | None = None,
        budgets: BudgetsConfig | None = None,
        on_event: BudgetEvent | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prices = prices or PriceTable()
        self.budgets = budgets or BudgetsConfig()
        self.on_event = on_event or (lambda name, data: None)
        self.clock = clock

    async def limits(self) -> dict[str, float]:
        """The configured budgets, as raised since with `/budget`."""
        limits = self.budgets.limits()
        if not limits:
            return {}
        raised = await self.store.budget_limits()
        return {name: raised.get(name, amount) for name, amount in limits.items()}

    async def set_limit(self, name: str, amount: float, by: str) -> None:
        """`/budget`: budget `name` is `amount` USD from now on, for every worker."""
        if name not in BUDGET_NAMES or name not in self.budgets.limits():
            raise ValueError(f"no budget named {name!r} is configured")
        before = (await self.limits()).get(name)
        await self.store.set_budget_limit(name, amount, by)
        self.on_event("budget.changed", {"budget": name, "from": before, "to": amount, "by": by})

    def for_run(self, who: Who, sink: EventSink) -> RunMeter:
        return RunMeter(self, who, sink)


class RunMeter:
    """One run's metering (`core.run_context.Meter`)."""

    def __init__(self, ledger: Ledger, who: Who, sink: EventSink) -> None:
        self.ledger, self.who, self.sink = ledger, who, sink

    async def reserve(
        self, kind: str, model: str, prompt_tokens: int | Callable[[], int], max_output: int
    ) -> Reservation:
        """Hold the call's worst case against every budget that applies. `prompt_tokens`
        may be a callable: the prompt is counted only when a budget applies.

        Raises:
            BudgetExceeded: a budget would be passed (or the model has no price and
                `unpriced = "deny"`); the message says which, what was spent and when
                it resets.
        """
        ledger = self.ledger
        limits = await ledger.limits()
        if not limits:
            return NOTHING
        prompt = prompt_tokens() if callable(prompt_tokens) else prompt_tokens
        worst = ledger.prices.price(model, Usage(prompt, max_output), kind)
        if worst is None:
            if ledger.budgets.unpriced == "allow":
                return NOTHING
            self._refused({"budget": "unpriced", "model": model})
            raise BudgetExceeded(unpriced_text(model))
        now = ledger.clock()
        found = [p for p in periods(self.who, now) if p.budget in limits]
        wants = [(p.key, worst, limits[p.budget]) for p in found]
        refused = await ledger.store.reserve_budget(wants)
        if refused is None:
            return Reservation(tuple(key for key, _, _ in wants), worst)
        period = next(p for p in found if p.key == refused.key)
        limit = limits[period.budget]
        self._refused(
            {"budget": period.budget, "key": period.key, "spent": round(refused.spent, 6),
             "limit": limit, "needed": round(worst, 6), "model": model}
        )  # fmt: skip
        raise BudgetExceeded(refusal_text(period, refused.spent, limit, worst))

    def settle(
        self, reservation: Reservation, provider: str, kind: str, model: str, usage: Usage | None
    ) -> float | None:
        """The call ended (`usage` None: it failed): record it, and let its reservation
        become what it really cost. Its cost in USD (None: the model has no price)."""
        ledger = self.ledger
        cost = None if usage is None else ledger.prices.price(model, usage, kind)
        if reservation.keys:
            ledger.store.settle_budget(reservation.keys, (cost or 0.0) - reservation.amount)
        if usage is None:
            return None
        who = self.who
        ledger.store.record_llm_call(
            LlmCall(
                ledger.clock(), who.run_id, who.conv, who.user, who.channel, who.job,
                provider, model, usage.input_tokens, usage.cached_tokens,
                usage.cache_write_tokens, usage.output_tokens, cost, usage.estimated,
            )
        )  # fmt: skip
        return cost

    def _refused(self, data: dict[str, Any]) -> None:
        data = {**data, "run_id": self.who.run_id, "user": self.who.user, "job": self.who.job}
        self.ledger.on_event("budget.refused", data)
        self.sink(Observed("budget.refused", data))


def usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:,.4f}"


def refusal_text(period: Period, spent: float, limit: float, needed: float) -> str:
    return (
        f"Stopped: the {period.budget} budget is reached ({usd(spent)} of {usd(limit)} "
        f"spent; the next call could cost up to {usd(needed)}). It resets at "
        f"{period.resets}; an admin can raise it with /budget. Nothing was lost: send "
        "your message again once it allows."
    )


def unpriced_text(model: str) -> str:
    return (
        f"Stopped: the model {model} has no known price, and budgets are set with "
        f'unpriced = "deny". An operator can give it a price in [prices."{model}"] '
        '(0 for a local model) or set [budgets] unpriced = "allow".'
    )


__all__ = ["NOTHING", "Ledger", "Period", "Reservation", "RunMeter", "Who", "periods"]
