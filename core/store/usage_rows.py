"""Priced usage and budgets (docs/cost.md): one row per LLM call, the running spend of each
budget period, and the limits an admin set with `/budget`. The rows, the SQL written once
for both backends, and the `UsageStore` seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from core.records import record

CALL_COLUMNS = (
    "at, run_id, conv, user_id, channel, job, provider, model, input_tokens, cached_tokens, "
    "cache_write_tokens, output_tokens, cost, estimated"
)


@record(frozen=True, slots=True)
class LlmCall:
    """One LLM call: who it was for, its tokens (`input_tokens` the whole prompt, of which
    `cached_tokens` were read from the prompt cache and `cache_write_tokens` written to
    it) and its cost in USD (None: the model has no price)."""

    at: float
    run_id: str
    conv: str
    user_id: str
    channel: str
    job: str
    provider: str
    model: str
    input_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    output_tokens: int
    cost: float | None
    estimated: bool = False

    def params(self) -> tuple[Any, ...]:
        return (
            self.at, self.run_id, self.conv, self.user_id, self.channel, self.job,
            self.provider, self.model, self.input_tokens, self.cached_tokens,
            self.cache_write_tokens, self.output_tokens, self.cost, int(self.estimated),
        )  # fmt: skip


def llm_call(row: Sequence[Any]) -> LlmCall:
    return LlmCall(
        float(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4]), str(row[5]),
        str(row[6]), str(row[7]), int(row[8]), int(row[9]), int(row[10]), int(row[11]),
        None if row[12] is None else float(row[12]), bool(row[13]),
    )  # fmt: skip


Want = tuple[str, float, float]
"""A reservation against one budget period: (its key, the amount, the limit)."""


@record(frozen=True, slots=True)
class Refused:
    """The reservation against `key` would pass its limit: `spent` is what it holds."""

    key: str
    spent: float


class UsageStore(Protocol):
    """What LLM calls cost and what each budget period has spent (docs/cost.md)."""

    def record_llm_call(self, call: LlmCall) -> None:
        """Queued: one call's usage and cost."""

    async def llm_calls(self, since: float, *, conv: str | None = None) -> list[LlmCall]:
        """The calls at or after `since` (of conversation `conv`), oldest first."""
        ...

    async def reserve_budget(self, wants: Sequence[Want]) -> Refused | None:
        """Committed, atomically across workers: add each amount to its period's spend if
        every one stays within its limit; else change nothing and say which would not.
        Everything queued before is committed first."""
        ...

    def settle_budget(self, keys: Sequence[str], delta: float) -> None:
        """Queued: add `delta` (the real cost less the reservation) to each period."""

    async def budget_spent(self, keys: Sequence[str]) -> dict[str, float]:
        """What each period has spent so far (a period never reserved against: absent)."""
        ...

    async def set_budget_limit(self, name: str, amount: float, by: str) -> None:
        """Committed: the limit of budget `name` (`per_user_day`, …) is `amount` from now on."""

    async def budget_limits(self) -> dict[str, float]:
        """The limits set with `set_budget_limit`, by budget name."""
        ...


__all__ = ["CALL_COLUMNS", "LlmCall", "Refused", "UsageStore", "Want", "llm_call"]
