"""`[prices]` and `[budgets]` in config.toml (docs/cost.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BudgetName = Literal[
    "per_user_day", "per_channel_month", "per_job_run", "per_trigger_day", "total_month"
]
BUDGET_NAMES: tuple[BudgetName, ...] = (
    "per_user_day",
    "per_channel_month",
    "per_job_run",
    "per_trigger_day",
    "total_month",
)


class ModelPrice(BaseModel):
    """`[prices."MODEL"]`: USD per million tokens. `cached` (prompt tokens read from the
    cache) defaults to `input`; `cache_write` (written to it) too."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, description="USD per million uncached input tokens.")
    output: float = Field(ge=0, description="USD per million output tokens.")
    cached: float | None = Field(None, ge=0, description="USD per million cached tokens.")
    cache_write: float | None = Field(None, ge=0, description="USD per million cache writes.")


class BudgetsConfig(BaseModel):
    """`[budgets]`: USD caps; none set (the default) means no budget is enforced."""

    model_config = ConfigDict(extra="forbid")

    unpriced: Literal["deny", "allow"] = Field(
        "deny", description="A call that cannot be priced, while any budget is set."
    )
    per_user_day: float | None = Field(None, ge=0, description="Per person per UTC day.")
    per_channel_month: float | None = Field(None, ge=0, description="Per chat per month.")
    per_job_run: float | None = Field(None, ge=0, description="Per cron job or trigger run.")
    per_trigger_day: float | None = Field(
        None, ge=0, description="Per trigger (all its runs) per UTC day."
    )
    total_month: float | None = Field(None, ge=0, description="All calls per month.")

    def limits(self) -> dict[str, float]:
        """The budgets set, by name."""
        return {n: v for n in BUDGET_NAMES if (v := getattr(self, n)) is not None}


__all__ = ["BUDGET_NAMES", "BudgetName", "BudgetsConfig", "ModelPrice"]
