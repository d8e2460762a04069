"""`parley audit [--since WHEN] [--verify [--anchor SEQ:HASH]]`: the audit log, read from
the store (docs/governance.md#the-audit-log)."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from collections.abc import Mapping

from bot.config import ParleyConfig
from bot.since import parse_since
from bot.wiring import open_existing_store
from core.audit import read_rows, verify
from core.errors import StoreError
from core.store import AuditStore

EXIT_BROKEN = 1
_HEX = re.compile(r"[0-9a-fA-F]{8,64}")


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def parse_anchor(text: str) -> tuple[int, str]:
    """`SEQ:HASH` as `--verify` prints it (HASH: at least 8 hex digits of row SEQ's)."""
    seq, _, digest = text.partition(":")
    if not seq.isdigit() or int(seq) < 1 or not _HEX.fullmatch(digest):
        raise ValueError(
            f"--anchor {text!r} is not SEQ:HASH as `parley audit --verify` prints it "
            "(e.g. 43:9c1e0b77a4d2f3e1)"
        )
    return int(seq), digest.lower()


async def audit_command(
    config: ParleyConfig,
    since: str | None,
    check: bool,
    environ: Mapping[str, str],
    anchor: str | None = None,
) -> int:
    try:
        start = parse_since(since) if since else 0.0
        kept = parse_anchor(anchor) if anchor else None
    except ValueError as exc:
        sys.stderr.write(f"parley: {exc}\n")
        return 2
    store = await open_existing_store(config.store, environ)
    if store is None:
        where = f"{config.store.resolved()} does not exist"
        if kept:
            sys.stdout.write(f"audit log BROKEN at row {kept[0]}: {where}\n")
            return EXIT_BROKEN
        sys.stdout.write(f"The audit log is empty ({where}).\n")
        return 0
    try:
        if check or kept:
            return await _verify(store, kept)
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


async def _verify(store: AuditStore, anchor: tuple[int, str] | None) -> int:
    """`--verify`: exit 0 with the head to keep elsewhere, or 1 naming the first problem."""
    try:
        count, problem = await verify(store, anchor)
        head = await store.audit_head()
    except StoreError as exc:  # a table dropped, say: the log cannot be vouched for
        sys.stdout.write(f"audit log BROKEN: it cannot be read ({exc})\n")
        return EXIT_BROKEN
    if problem is not None:
        sys.stdout.write(f"audit log BROKEN at row {problem.seq}: {problem.text}\n")
        return EXIT_BROKEN
    # SEQ:HASH is what `--anchor` takes back: kept outside the store, it shows a log cut
    # back to an earlier row with its head moved back, which verifies on its own.
    last = f"; head {head[0]}:{head[1][:16]}" if head and head[0] else ""
    kept = f"; row {anchor[0]} is the anchor's" if anchor else ""
    sys.stdout.write(f"audit log intact: {count} rows, every hash matches{last}{kept}\n")
    return 0
