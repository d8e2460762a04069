"""`parley usage [--by user|channel|job|model|day] [--since …] [--csv]`: what LLM calls
cost, summed from the store (docs/cost.md#usage)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping

from bot.config import ParleyConfig
from bot.since import parse_since
from bot.wiring import open_existing_store
from core.cost.report import GroupBy, csv_text, summarize, table


async def usage_command(
    config: ParleyConfig, by: GroupBy, since: str, as_csv: bool, environ: Mapping[str, str]
) -> int:
    try:
        start = parse_since(since, time.time())
    except ValueError as exc:
        sys.stderr.write(f"parley: {exc}\n")
        return 2
    store = await open_existing_store(config.store, environ)
    if store is None:
        sys.stdout.write(f"No usage yet ({config.store.resolved()} does not exist).\n")
        return 0
    try:
        rows = summarize(await store.llm_calls(start), by)
    finally:
        await store.aclose()
    sys.stdout.write(csv_text(rows, by) if as_csv else table(rows, by) + "\n")
    return 0


__all__ = ["parse_since", "usage_command"]
