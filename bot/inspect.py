"""`parley runs` and `parley runs show ID`: what the agent did, read from the store."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Mapping

from bot.config import ParleyConfig
from bot.wiring import open_existing_store
from core.agent import parse_conv
from core.agent.journal import journal_of
from core.store import RunRow, Store


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(run: RunRow) -> str:
    if run.started_at is None or run.ended_at is None:
        return "-"
    return f"{run.ended_at - run.started_at:.1f}s"


async def runs_command(
    config: ParleyConfig,
    action: str | None,
    run_id: str | None,
    limit: int,
    environ: Mapping[str, str],
) -> int:
    store = await open_existing_store(config.store, environ)
    if store is None:
        sys.stdout.write(f"No runs yet ({config.store.resolved()} does not exist).\n")
        return 0
    try:
        if action == "show":
            return await _show(store, run_id)
        return await _list(store, limit)
    finally:
        await store.aclose()


async def _list(store: Store, limit: int) -> int:
    runs = await store.runs(limit=limit)
    if not runs:
        sys.stdout.write("No runs yet.\n")
        return 0
    rows: list[tuple[str, ...]] = [
        ("RUN", "STARTED", "STATE", "TRIGGER", "ITER", "TOKENS", "TIME", "CONVERSATION")
    ]
    listed = {run.id for run in runs}
    for run in runs:
        if run.parent_run_id in listed:
            continue  # shown under its parent
        rows.append(_row(run, "↳ " if run.parent_run_id else ""))
        for child in await store.child_runs(run.id):  # children indented under the parent
            rows.append(_row(child, "  ↳ "))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        sys.stdout.write("\n")
    return 0


def _row(run: RunRow, indent: str) -> tuple[str, ...]:
    state = run.state + (" (resumable)" if run.resumable else "")
    return (
        indent + run.id,
        _when(run.started_at),
        state,
        run.trigger,
        str(run.iterations),
        f"{run.input_tokens}/{run.output_tokens}",
        _duration(run),
        run.conv,
    )


async def _show(store: Store, run_id: str | None) -> int:
    if not run_id:
        sys.stderr.write("parley: `runs show` needs a run id (see `parley runs`)\n")
        return 2
    found = await store.find_runs(run_id)
    if len(found) != 1:
        what = "no run" if not found else f"{len(found)} runs"
        sys.stderr.write(f"parley: {what} with an id starting `{run_id}`\n")
        return 1
    run = found[0]
    channel, channel_id, thread = parse_conv(run.conv)
    out = sys.stdout
    out.write(f"Run {run.id}: {run.state} ({run.reason or '-'}), trigger {run.trigger}\n")
    out.write(f"Conversation: {channel} {channel_id}{' thread ' + thread if thread else ''}\n")
    out.write(f"Started {_when(run.started_at)}, ended {_when(run.ended_at)} ({_duration(run)})\n")
    out.write(
        f"Iterations {run.iterations}, tokens {run.input_tokens} in / {run.output_tokens} out\n"
    )
    if run.text:
        out.write(f"Final text: {run.text[:500]}\n")
    if run.parent_run_id:
        out.write(f"Parent run: {run.parent_run_id} (this is a child run it delegated)\n")
    children = await store.child_runs(run.id)
    if children:
        out.write(f"\nChildren ({len(children)}):\n")
        for child in children:
            answer = " ".join((child.text or "").split())[:80]
            out.write(f"  {child.id}  {child.state}  it={child.iterations}  {answer}\n")
    events = await store.events(run.id)
    trace = next((str(d["trace_id"]) for _, _, _, d in events if d.get("trace_id")), None)
    if trace:
        out.write(f"Trace: {trace}\n")
    out.write("\nEvents:\n")
    start = events[0][0] if events else 0.0
    for at, name, iteration, data in events:
        detail = json.dumps(data, ensure_ascii=False, default=str)
        step = "-" if iteration is None else str(iteration)
        out.write(f"  +{at - start:7.3f}s  it={step}  {name}  {detail}\n")
    journal = await store.journal(run.conv)
    out.write("\n" + journal_of(journal).render() + "\n")
    return 0
