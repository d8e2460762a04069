"""The operator's page (docs/operations.md#the-operators-page): server-rendered HTML, no
script and no build step. Every text that reaches the page passes through
`bot.admin_html.e` (HTML escaping, quotes included); nothing else is interpolated but fixed
markup and numbers.

Read-only: it shows the workers (on PostgreSQL every worker the store lists, with its
heartbeat's age and the leases it holds; on SQLite the one process), the recent runs by
state (each opening to its transcript, tool calls and events), the pending approvals,
the triggers' latest deliveries (docs/triggers.md), usage and cost per day
(`bot.admin_usage`) and the last entries of the audit log.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import TYPE_CHECKING

from bot.admin_html import ago, e
from bot.admin_html import cap as _cap
from bot.admin_html import json_text as _json
from bot.admin_html import page as _page
from bot.admin_html import pre as _pre
from bot.admin_html import table as _table
from bot.admin_html import when as _when
from bot.admin_usage import DAYS, usage_section
from core.errors import StoreError
from core.store import RunRow, SharedStore, Store, WorkerState

if TYPE_CHECKING:
    from bot.singletons import Singletons
    from core.agent import Agent

RECENT = 50  # runs listed on the overview
AUDIT = 50  # audit log entries listed on the overview
DELIVERIES = 20  # trigger deliveries listed on the overview (refused ones are not stored)


def login_form(problem: str = "") -> str:
    note = f"<p class=state-failed>{e(problem)}</p>" if problem else ""
    form = (
        f"{note}<p>This page needs the operator's token (<code>[server] admin_token_env</code>)."
        "</p><form method=post action=/login><label>Token "
        "<input type=password name=token autocomplete=off></label> "
        "<button type=submit>Log in</button></form>"
    )
    return _page("Parley: log in", form)


def not_found() -> str:
    return _page("Parley: no such run", "<p><a href=/>Back</a></p>")


async def overview(agent: Agent, leased: Singletons | None) -> str:
    store = agent.store
    parts = ["<h2>Workers</h2>", await _workers(agent, leased)]
    runs = await store.runs(limit=RECENT)
    counts = Counter(run.state for run in runs)
    parts.append(f"<h2>Runs (the last {len(runs)})</h2>")
    parts.append(_table(["state", "runs"], [[e(s), e(n)] for s, n in sorted(counts.items())]))
    parts.append(_table(["run", "state", "trigger", "started", "conversation"], _run_rows(runs)))
    approvals = await store.pending_approvals(before=time.time() + 1)
    parts.append("<h2>Pending approvals</h2>")
    parts.append(
        _table(
            ["asked", "tool", "summary", "run", "conversation"],
            [
                [
                    e(_when(a.requested_at)),
                    e(a.tool),
                    f"<pre>{e(_cap(a.summary))}</pre>",
                    f"<a href=/runs/{e(a.run_id)}>{e(a.run_id)}</a>" if a.run_id else "-",
                    e(a.conv),
                ]
                for a in approvals
            ],
        )
    )
    deliveries = await store.recent_deliveries(DELIVERIES)
    parts.append(f"<h2>Trigger deliveries (the last {len(deliveries)})</h2>")
    parts.append(
        _table(
            ["received", "trigger", "delivery", "event", "outcome", "run"],
            [
                [
                    e(_when(d.received_at)),
                    e(d.trigger),
                    e(d.delivery_id),
                    e(d.event_type),
                    e(d.outcome),
                    f"<a href=/runs/{e(d.run_id)}>{e(d.run_id)}</a>" if d.run_id else "-",
                ]
                for d in deliveries
            ],
        )
    )
    parts.append(f"<h2>Usage and cost per day (the last {DAYS} days, UTC)</h2>")
    parts.append(await usage_section(store, time.time()))
    parts.append(f"<h2>Audit log (the last {AUDIT})</h2>")
    head = await store.audit_head()
    rows = await store.audit_rows(after=max(0, (head or (0, ""))[0] - AUDIT), limit=AUDIT)
    parts.append(
        _table(
            ["#", "at", "kind", "who", "conversation", "detail"],
            [
                [e(r.seq), e(_when(r.at)), e(r.kind), e(r.actor), e(r.conv), _pre(_json(r.detail))]
                for r in reversed(rows)
            ],
        )
    )
    parts.append(
        "<p class=muted>The whole audit log, verified: <code>parley audit --verify</code>; "
        "usage by user, channel or job: <code>parley usage --by user</code> (or channel, job)."
        "</p>"
    )
    return _page("Parley", "".join(parts))


async def _workers(agent: Agent, leased: Singletons | None) -> str:
    """Every worker the shared store lists (PostgreSQL), with its heartbeat's age and its
    leases, then this one's own facts; on SQLite, one process: this one."""
    workers = agent.workers
    store = agent.store
    if workers is None or not isinstance(store, SharedStore):
        return "<p>One process (SQLite): it holds everything.</p>" + _worker(agent, leased)
    try:
        states = await store.worker_states()
    except StoreError as exc:
        listed = f"<p class=state-failed>The store did not answer: {e(exc)}</p>"
    else:
        timeout = workers.settings.timeout
        listed = _table(
            ["worker", "last heartbeat", "up for", "leases held (time left)"],
            [_state_row(s, workers.id, timeout) for s in states],
        )
    return listed + "<h3>This worker</h3>" + _worker(agent, leased)


def _state_row(state: WorkerState, this: str, timeout: float) -> list[str]:
    name = e(state.id) + (" <b>(this one)</b>" if state.id == this else "")
    if state.beat_age is None:
        beat = "<span class=state-failed>not listed (taken for dead)</span>"
    elif state.beat_age > timeout:
        beat = f"<span class=state-failed>{e(ago(state.beat_age))} ago: silent</span>"
    else:
        beat = e(f"{ago(state.beat_age)} ago")
    up = "-" if state.up_for is None else e(ago(state.up_for))
    leases = ", ".join(f"{lease} ({ago(left)})" for lease, left in state.leases) or "none"
    return [name, beat, up, e(leases)]


def _worker(agent: Agent, leased: Singletons | None) -> str:
    rows: list[list[str]] = []
    workers = agent.workers
    if workers is not None:
        fresh = "current" if workers.liveness.fresh() else "NOT current"
        rows.append(["worker", e(workers.id)])
        rows.append(["heartbeat", e(fresh)])
    if leased is not None:
        held = [h.name for h in leased.holders if h.held.is_set()]
        rows.append(["leases held", e(", ".join(held) or "none")])
        rows.append(["leases sought", e(", ".join(leased.names()) or "none")])
    lanes = list(agent.lanes.values())
    running = sum(1 for lane in lanes if getattr(lane, "run_id", None) is not None)
    rows.append(["lanes running", e(running)])
    rows.append(["messages queued", e(sum(getattr(lane, "waiting", 0) for lane in lanes))])
    return _table(["", ""], rows)


def _run_rows(runs: list[RunRow]) -> list[list[str]]:
    return [
        [
            f"<a href=/runs/{e(run.id)}>{e(run.id)}</a>",
            f"<span class=state-{e(run.state)}>{e(run.state)}</span>",
            e(run.trigger),
            e(_when(run.started_at)),
            e(run.conv),
        ]
        for run in runs
    ]


async def run_detail(store: Store, run_id: str) -> str | None:
    run = await store.run(run_id)
    if run is None:
        return None
    facts = [
        ["state", e(f"{run.state} ({run.reason or '-'})")],
        ["trigger", e(run.trigger)],
        ["conversation", e(run.conv)],
        ["started / ended", e(f"{_when(run.started_at)} / {_when(run.ended_at)}")],
        ["iterations", e(run.iterations)],
        ["tokens in / out", e(f"{run.input_tokens} / {run.output_tokens}")],
    ]
    events = await store.events(run.id)
    trace = next((str(d["trace_id"]) for _, _, _, d in events if d.get("trace_id")), None)
    if trace:
        facts.append(["trace id", f"<code>{e(trace)}</code>"])
    if run.text:
        facts.append(["answer", f"<pre>{e(_cap(run.text))}</pre>"])
    parts = ["<p><a href=/>All runs</a></p>", _table(["", ""], facts)]
    calls = await store.tool_calls(run.id)
    parts.append("<h2>Tool calls</h2>")
    parts.append(
        _table(
            ["tool", "arguments", "result", "started"],
            [
                [
                    e(call.name),
                    f"<pre>{e(_cap(call.arguments))}</pre>",
                    f"<pre>{e(_cap(call.result or '(not finished)'))}</pre>"
                    + (" <b class=state-failed>error</b>" if call.is_error else ""),
                    e(_when(call.started_at)),
                ]
                for call in calls.values()
            ],
        )
    )
    parts.append("<h2>Transcript of its conversation</h2>")
    messages = await store.load_messages(run.conv)
    rows: list[list[str]] = []
    for message in messages:
        text = message.content
        if message.tool_calls:
            text += "".join(f"\n→ {c.name}({c.arguments})" for c in message.tool_calls)
        rows.append([e(message.role), f"<pre>{e(_cap(text))}</pre>"])
    parts.append(_table(["role", "text"], rows))
    parts.append("<h2>Events</h2>")
    start = events[0][0] if events else 0.0
    parts.append(
        _table(
            ["at", "iteration", "event", "data"],
            [
                [
                    e(f"+{at - start:.3f}s"),
                    e("-" if iteration is None else iteration),
                    e(name),
                    f"<pre>{e(json.dumps(data, ensure_ascii=False, default=str))}</pre>",
                ]
                for at, name, iteration, data in events
            ],
        )
    )
    return _page(f"Run {run.id}", "".join(parts))
