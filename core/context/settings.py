"""`[context]` settings (docs/context.md): thresholds, the recovery ladder, the strategy."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from core.sections import SECTION_CONFIG

Strategy = Literal["summary", "subgoal", "subgoal_mig", "focus"]


class FocusSettings(BaseModel):
    """`[context.focus]`: only with `[context] strategy = "focus"`
    (docs/context.md#the-focus-strategy; the strategy itself, core/context/focus.py, is
    loaded only for it)."""

    model_config = SECTION_CONFIG

    compression_interval: int = Field(
        12, ge=1, description="Tool steps without a completed focus before a reminder."
    )
    max_knowledge_tokens: int = Field(
        4000, ge=64, description="Cap of the Knowledge block; the oldest segment goes first."
    )
    auto_consolidate_min_window: int = Field(
        4, description="Turns between auto-consolidation passes (at least 1)."
    )
    consolidate_threshold: float = Field(
        0.5, gt=0, le=1, description="Word-set similarity at which two segments are merged."
    )

    @field_validator("auto_consolidate_min_window")
    @classmethod
    def _window(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"must be at least 1 (got {value}): 0 would call the summary model on every "
                "completed focus; the default is 4"
            )
        return value


class ContextSettings(BaseModel):
    """`[context]` in config.toml: thresholds are fractions of the model's context window."""

    model_config = SECTION_CONFIG

    soft: float = Field(0.60, gt=0, le=1, description="Mask old tool outputs above this.")
    compact: float = Field(0.70, gt=0, le=1, description="Run the recovery ladder above this.")
    hard: float = Field(0.95, gt=0, le=1, description="Fail the turn above this.")
    manual_target: float = Field(0.50, gt=0, le=1, description="Target of `/compact`.")
    keep_tail: int = Field(10, ge=1, description="Messages kept verbatim by R1.")
    deep_keep: int = Field(4, ge=1, description="Messages kept verbatim by R2.")
    taco_threshold: int = Field(2000, ge=1, description="Tokens; bigger tool outputs shrink.")
    taco_target: int = Field(500, ge=1, description="Tokens a compressed output aims for.")
    max_recoveries: int = Field(4, ge=0, description="Recovery actions per user turn.")
    escalate_after_iterations: int = Field(20, ge=0, description="R1→R2→R3 window.")
    summary_max_input_tokens: int = Field(24000, ge=256, description="Summarizer input cap.")
    mask_batch: int = Field(
        8,
        ge=1,
        description="Old tool outputs masked at once: history is rewritten in batches, so "
        "the provider's prompt cache breaks once per batch, not on every call.",
    )
    strategy: Strategy = Field(
        "summary", description="What compaction keeps: summary, subgoal, subgoal_mig or focus."
    )
    focus: FocusSettings = Field(
        default_factory=FocusSettings, description="`[context.focus]`: the focus strategy."
    )
    mask_placeholder: str = Field(
        "[old tool output removed to save context; call the tool again if you need it]",
        min_length=1,
    )

    @model_validator(mode="after")
    def _ordered(self) -> ContextSettings:
        if not self.soft <= self.compact <= self.hard:
            raise ValueError("thresholds must satisfy soft <= compact <= hard")
        if "focus" in self.model_fields_set and self.strategy in ("subgoal", "subgoal_mig"):
            raise ValueError(
                f'context.focus is set but context.strategy = "{self.strategy}": the focus '
                "and subgoal strategies are mutually exclusive; set context.strategy = "
                '"focus" or remove [context.focus]'
            )
        return self
