"""`parley usage [--by user|channel|job|model|day] [--since …] [--csv]`: what LLM calls
cost, summed from the store (docs/cost.md#usage)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping

from bot.app import open_configured_store
from bot.config import ParleyConfig
from bot.since import parse_since
from core.cost.report import GroupBy, csv_text, summarize, table


async def usage_command(
    config: ParleyConfig, by: GroupBy, since: str, as_csv: bool, environ: Mapping[str, str]
) -> int:
    try:
        start = parse_since(since, time.time())
    except ValueError as exc:
        sys.stderr.write(f"parley: {exc}\n")
        return 2
    path = config.store.resolved()
    if config.store.backend() == "sqlite" and not path.exists():
        sys.stdout.write(f"No usage yet ({path} does not exist).\n")
        return 0
    store = await open_configured_store(config.store, environ)
    try:
        rows = summarize(await store.llm_calls(start), by)
    finally:
        await store.aclose()
    sys.stdout.write(csv_text(rows, by) if as_csv else table(rows, by) + "\n")
    return 0


__all__ = ["parse_since", "usage_command"]
