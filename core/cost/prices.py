"""A call's price in USD (docs/cost.md#prices): `[prices."MODEL"]` when configured, else
the `genai-prices` table, with its cached-token discounts.

The table is the package's bundled snapshot: Parley never starts its auto-updater
(`genai_prices.UpdatePrices`), so pricing reads no network; upgrading the package
updates the prices. The package is imported on first use (its table is large).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from core.cost.settings import ModelPrice
from core.events import Usage

log = logging.getLogger(__name__)
MILLION = 1_000_000
_PROVIDER_IDS = {"anthropic": "anthropic"}  # a wire format that names its vendor


class PriceTable:
    """Prices calls: `overrides` (`[prices]`, by model name) first, then `genai-prices`."""

    def __init__(self, overrides: Mapping[str, ModelPrice] | None = None) -> None:
        self.overrides = dict(overrides or {})

    def price(self, model: str, usage: Usage, kind: str = "") -> float | None:
        """USD for `usage` of `model` (`kind`: the provider's wire format, a hint for
        the table); None when neither `[prices]` nor the table knows the model."""
        given = self.overrides.get(model)
        if given is not None:
            return _priced(given, usage)
        return _table_price(model, _PROVIDER_IDS.get(kind), usage)

    def priced(self, model: str, kind: str = "") -> bool:
        return self.price(model, Usage(1, 1), kind) is not None


def _priced(price: ModelPrice, usage: Usage) -> float:
    cached = price.input if price.cached is None else price.cached
    written = price.input if price.cache_write is None else price.cache_write
    uncached = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens)
    total = (
        uncached * price.input
        + usage.cached_tokens * cached
        + usage.cache_write_tokens * written
        + usage.output_tokens * price.output
    )
    return total / MILLION


def _table_price(model: str, provider_id: str | None, usage: Usage) -> float | None:
    found = _table_model(model, provider_id)
    if found is None:
        return None
    import genai_prices

    given = genai_prices.Usage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cached_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
    )
    try:
        return float(genai_prices.calc_price(given, model, provider_id=found).total_price)
    except (LookupError, ValueError, ArithmeticError):  # a usage the table cannot price
        log.warning("genai-prices could not price %s for %s", usage, model, exc_info=True)
        return None


@lru_cache(maxsize=256)
def _table_model(model: str, provider_id: str | None) -> str | None:
    """The table's provider id for `model`, or None when the table does not know it."""
    try:
        import genai_prices
    except ImportError:  # pragma: no cover - a dependency; [prices] still works without
        log.warning("genai-prices is not installed: only [prices] can price calls")
        return None
    probe: Any = genai_prices.Usage(input_tokens=1, output_tokens=1)
    try:
        calc = genai_prices.calc_price(probe, model, provider_id=provider_id)
    except LookupError:
        return None
    return str(calc.provider.id)


__all__ = ["MILLION", "PriceTable"]
