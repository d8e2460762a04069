"""The operator's page's markup (docs/operations.md#the-operators-page): the one HTML
escape every text passes through, and the few pieces of fixed markup the page's parts
(`bot.admin_page`, `bot.admin_usage`) are built from. Nothing else is interpolated but
fixed markup and numbers."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
import json

TEXT_CAP = 4000  # characters of one message or result shown

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3} pre{white-space:pre-wrap;margin:0;max-width:70em}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.state-failed,.state-timed_out{color:#b00}.state-completed{color:#070}
.muted{color:#777}
.usage{display:flex;flex-wrap:wrap;gap:2em;align-items:flex-start}
.usage svg{border:1px solid #ccc;background:#fcfcfc}
"""

_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (
    "default-src 'none'; "
    f"style-src 'sha256-{_STYLE_HASH}'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The page's Content-Security-Policy, as docs/operations.md#the-operators-page states it:
no script, image, font, frame or connection at all; of styles only the one `<style>`
element below (`STYLE`, by its hash — an injected `<style>` or `style=` would restyle
nothing, e.g. hide a row); the login form posts only here; no other site may frame it."""


def e(value: object) -> str:
    """Escape any text for HTML (element content and quoted attributes)."""
    return html.escape(str(value), quote=True)


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def cap(text: str) -> str:
    return text if len(text) <= TEXT_CAP else text[:TEXT_CAP] + f"… ({len(text)} characters)"


def json_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def pre(text: str) -> str:
    return f"<pre>{e(cap(text))}</pre>"


def page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{e(title)}</h1>{body}</body></html>"
    )


def table(head: list[str], rows: list[list[str]], *, numeric_from: int | None = None) -> str:
    """`rows` cells are HTML already (escaped by the caller); cells from column
    `numeric_from` on are right-aligned numbers."""
    if not rows:
        return "<p class=muted>none</p>"
    top = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" if any(head) else ""

    def cell(i: int, c: str) -> str:
        numeric = numeric_from is not None and i >= numeric_from
        return f"<td class=num>{c}</td>" if numeric else f"<td>{c}</td>"

    body = "".join(
        "<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table>{top}{body}</table>"


def ago(seconds: float) -> str:
    """A span of time, shortly: 0.4 s, 12 s, 3 min, 5 h, 2 d."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} s"


__all__ = ["CSP", "STYLE", "ago", "cap", "e", "json_text", "page", "pre", "table", "when"]
