"""`parley audit [--since WHEN] [--verify]`: the audit log, read from the store
(docs/governance.md#the-audit-log)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Mapping

from bot.config import ParleyConfig
from bot.since import parse_since
from bot.wiring import open_existing_store
from core.audit import read_rows, verify

EXIT_BROKEN = 1


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


async def audit_command(
    config: ParleyConfig, since: str | None, check: bool, environ: Mapping[str, str]
) -> int:
    try:
        start = parse_since(since) if since else 0.0
    except ValueError as exc:
        sys.stderr.write(f"parley: {exc}\n")
        return 2
    store = await open_existing_store(config.store, environ)
    if store is None:
        sys.stdout.write(f"The audit log is empty ({config.store.resolved()} does not exist).\n")
        return 0
    try:
        if check:
            count, problem = await verify(store)
            if problem is not None:
                sys.stdout.write(f"audit log BROKEN at row {problem.seq}: {problem.text}\n")
                return EXIT_BROKEN
            head = await store.audit_head()
            last = f"; head {head[1][:16]}" if head and head[0] else ""
            sys.stdout.write(f"audit log intact: {count} rows, every hash matches{last}\n")
            return 0
        rows = await read_rows(store, start)
    finally:
        await store.aclose()
    if not rows:
        sys.stdout.write("No audit entries" + (" since then.\n" if since else " yet.\n"))
        return 0
    table = [("SEQ", "AT", "KIND", "ACTOR", "CONVERSATION", "DETAIL")]
    for row in rows:
        detail = json.dumps(row.detail, ensure_ascii=False, sort_keys=True)
        table.append((str(row.seq), _when(row.at), row.kind, row.actor, row.conv or "-", detail))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for line in table:
        cells = [c.ljust(w) for c, w in zip(line[:5], widths, strict=True)]
        sys.stdout.write("  ".join([*cells, line[5]]).rstrip() + "\n")
    return 0
