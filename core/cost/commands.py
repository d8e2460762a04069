"""`/usage` and `/budget` (docs/commands.md, docs/cost.md): what was spent, and the
budgets, which approvers (the admin role) may raise."""

from __future__ import annotations

from core.chat import Asker
from core.command_table import Refused
from core.cost.meter import Ledger, Who, periods, usd
from core.cost.report import period_start, summarize
from core.cost.settings import BUDGET_NAMES
from core.store.usage_rows import LlmCall

USAGE_HELP = "Usage: /usage [today|month]"
BUDGET_HELP = "Usage: /budget, or /budget set NAME USD (NAME: " + ", ".join(BUDGET_NAMES) + ")"


async def usage_command(ledger: Ledger, asker: Asker, args: str) -> str:
    """`/usage [today|month]`: the period's spend in all, in this chat, and yours."""
    period = args.strip().lower() or "today"
    if period not in ("today", "month"):
        return USAGE_HELP
    now = ledger.clock()
    calls = await ledger.store.llm_calls(period_start(period, now))
    who = Who.of("", asker.conv, asker)
    here = [c for c in calls if c.channel == who.channel]
    mine = [c for c in calls if who.user and c.user_id == who.user]
    lines = [f"Usage {'today' if period == 'today' else 'this month'} (UTC):"]
    lines.append(_line("All", calls))
    lines.append(_line("This chat", here))
    if who.user:
        lines.append(_line("You", mine))
    models = summarize(calls, "model")[:-1]
    lines += [f"  {t.key}: {usd(t.cost)} in {t.calls} calls" for t in models[:5]]
    return "\n".join(lines)


def _line(label: str, calls: list[LlmCall]) -> str:
    [total] = summarize(calls, "model")[-1:]
    cached = total.cached_tokens * 100 // max(total.input_tokens, 1)
    unpriced = f", {total.unpriced} unpriced" if total.unpriced else ""
    return (
        f"{label}: {usd(total.cost)} — {total.calls} calls, {total.input_tokens:,} tokens in "
        f"({cached}% from cache), {total.output_tokens:,} out{unpriced}"
    )


async def budget_command(
    ledger: Ledger, asker: Asker, args: str, admin: bool
) -> tuple[str | Refused, bool]:
    """`/budget`: each budget, its limit and what its period here has spent;
    `/budget set NAME USD` raises (or lowers) one, for admins (anyone else's is
    `Refused`). The reply, and whether a budget changed."""
    words = args.split()
    if not words:
        return await _budgets(ledger, asker), False
    if words[0] != "set" or len(words) != 3:
        return BUDGET_HELP, False
    if not admin:
        return Refused("Only admins (this channel's approvers) can change a budget."), False
    name = words[1]
    try:
        amount = float(words[2].lstrip("$"))
    except ValueError:
        return f"{words[2]!r} is not an amount in USD. {BUDGET_HELP}", False
    if amount < 0 or amount != amount or amount == float("inf"):
        return "A budget is a finite amount of USD, 0 or more.", False
    try:
        await ledger.set_limit(name, amount, f"{asker.channel}:{asker.user_id}")
    except ValueError:
        configured = ", ".join(ledger.budgets.limits()) or "none"
        reply = f"No budget {name} is configured (configured: {configured}); [budgets] sets them."
        return reply, False
    return f"The {name} budget is now {usd(amount)}.", True


async def _budgets(ledger: Ledger, asker: Asker) -> str:
    limits = await ledger.limits()
    if not limits:
        return "No budget is set; [budgets] in config.toml sets them (docs/cost.md)."
    now = ledger.clock()
    found = [p for p in periods(Who.of("", asker.conv, asker), now) if p.budget in limits]
    spent = await ledger.store.budget_spent([p.key for p in found])
    lines = ["Budgets (USD):"]
    for period in found:
        held = spent.get(period.key, 0.0)
        lines.append(
            f"{period.budget}: {usd(held)} of {usd(limits[period.budget])} spent here; "
            f"resets at {period.resets}"
        )
    lines += [f"{name}: {usd(limit)}" for name, limit in limits.items() if name == "per_job_run"]
    lines.append(f"Unpriced models: {ledger.budgets.unpriced}. Admins: /budget set NAME USD")
    return "\n".join(lines)


async def cache_status(ledger: Ledger, conv: str) -> str:
    """`/status`'s line on the prompt cache and cost of conversation `conv`."""
    calls = await ledger.store.llm_calls(0.0, conv=conv)
    [total] = summarize(calls, "model")[-1:]
    cached = total.cached_tokens * 100 // max(total.input_tokens, 1)
    return (
        f"Prompt cache: {total.cached_tokens:,} of {total.input_tokens:,} input tokens read "
        f"from cache ({cached}%), {total.cache_write_tokens:,} written; cost here "
        f"{usd(total.cost)}"
    )


__all__ = ["budget_command", "cache_status", "usage_command"]
