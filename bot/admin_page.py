"""The operator's page (docs/operations.md#the-operators-page): server-rendered HTML, no
script and no build step. Every text that reaches the page passes through `e()` (HTML
escaping, quotes included); nothing else is interpolated but fixed markup and numbers.

Read-only: it shows this worker, its heartbeat and leases, the recent runs by state (each
opening to its transcript, tool calls and events), the pending approvals and the last
entries of the audit log. Usage and cost per day is not on it yet.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import time
from collections import Counter
from typing import TYPE_CHECKING

from core.store import RunRow, Store

if TYPE_CHECKING:
    from bot.singletons import Singletons
    from core.agent import Agent

RECENT = 50  # runs listed on the overview
AUDIT = 50  # audit log entries listed on the overview
TEXT_CAP = 4000  # characters of one message or result shown


def e(value: object) -> str:
    """Escape any text for HTML (element content and quoted attributes)."""
    return html.escape(str(value), quote=True)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _cap(text: str) -> str:
    return text if len(text) <= TEXT_CAP else text[:TEXT_CAP] + f"… ({len(text)} characters)"


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3} pre{white-space:pre-wrap;margin:0;max-width:70em}
.state-failed,.state-timed_out{color:#b00}.state-completed{color:#070}
.muted{color:#777}
"""


def _json(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _pre(text: str) -> str:
    return f"<pre>{e(_cap(text))}</pre>"


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{e(title)}</h1>{body}</body></html>"
    )


def _table(head: list[str], rows: list[list[str]]) -> str:
    """`rows` cells are HTML already (escaped by the caller)."""
    if not rows:
        return "<p class=muted>none</p>"
    top = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" if any(head) else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{top}{body}</table>"


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
    parts = ["<h2>This worker</h2>", _worker(agent, leased)]
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
        "<p class=muted>Not on this page yet: usage and cost per day (once usage is "
        "priced). The whole audit log, verified: <code>parley audit --verify</code>.</p>"
    )
    return _page("Parley", "".join(parts))


def _worker(agent: Agent, leased: Singletons | None) -> str:
    rows: list[list[str]] = []
    workers = agent.workers
    if workers is None:
        rows.append(["process", "one process on SQLite: it holds everything"])
    else:
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
