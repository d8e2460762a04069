"""Reply text for chat platforms: splitting over the size limit and Markdown conversion.

Models answer in CommonMark-ish Markdown; each platform wants its own dialect and has a
per-message limit (SPEC §9). `split_message` cuts at paragraph, line, word boundaries
(in that order) and never leaves a code fence open in a piece: a cut inside a fence
closes it and reopens it, with the same info string, in the next piece.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

Measure = Callable[[str], int]

# A fence line: up to any indentation (models indent fences inside list items), three or
# more backticks or tildes, then the info string (or nothing, for a closing line).
_FENCE_LINE = re.compile(r"^([ \t]*)(`{3,}|~{3,})([^\n]*)$")


def utf8_len(text: str) -> int:
    """Size of `text` in UTF-8 bytes (Slack's limits are in bytes)."""
    return len(text.encode("utf-8"))


# ---- fences ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fence:
    """A fenced code block of some text; its content is `text[start:end]`."""

    opener: str  # the opening line without its newline, e.g. "```python"
    closer: str  # the line that closes it, e.g. "```"
    lang: str
    line_start: int  # where the opening line starts
    start: int  # first content index (after the opening line's newline)
    end: int  # where the closing line starts (len(text) when unclosed)
    close_end: int  # after the closing line and its newline (len(text) when unclosed)


def _opens(line: str) -> re.Match[str] | None:
    m = _FENCE_LINE.match(line)
    # CommonMark: a backtick fence's info string has no backticks ("```x```" is inline code).
    if m is None or (m[2][0] == "`" and "`" in m[3]):
        return None
    return m


def _closes(line: str, opener: re.Match[str]) -> bool:
    m = _FENCE_LINE.match(line)
    return (
        m is not None
        and m[2][0] == opener[2][0]
        and len(m[2]) >= len(opener[2])
        and not m[3].strip()
    )


def _fences(text: str) -> list[_Fence]:
    """The fenced code blocks of `text`, in order; the last may be unclosed."""
    fences: list[_Fence] = []
    opened: tuple[int, int, re.Match[str]] | None = None
    pos, n = 0, len(text)
    while pos < n:
        newline = text.find("\n", pos)
        line_end = n if newline < 0 else newline + 1
        line = text[pos:line_end].rstrip("\n")
        if opened is None:
            m = _opens(line)
            if m is not None:
                opened = (pos, line_end, m)
        elif _closes(line, opened[2]):
            fences.append(_fence(opened, end=pos, close_end=line_end))
            opened = None
        pos = line_end
    if opened is not None:
        fences.append(_fence(opened, end=n, close_end=n))
    return fences


def _fence(opened: tuple[int, int, re.Match[str]], *, end: int, close_end: int) -> _Fence:
    line_start, start, m = opened
    info = m[3].strip()
    return _Fence(
        opener=m[0].rstrip("\r"),
        closer=m[1] + m[2],
        lang=info.split()[0] if info else "",
        line_start=line_start,
        start=start,
        end=end,
        close_end=close_end,
    )


# ---- splitting ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Piece:
    head: str  # a reopened fence line and newline, or ""
    body: str  # a slice of the original text
    tail: str  # a fence closing line added after the body, or ""

    @property
    def text(self) -> str:
        return self.head + self.body + self.tail


def split_message(text: str, limit: int, measure: Measure = len) -> list[str]:
    """Cut `text` into pieces with `measure(piece) <= limit`.

    Cuts at paragraph ("\\n\\n") boundaries first, then lines, then words, then anywhere.
    A cut inside a code fence closes the fence at the end of the piece and reopens it
    (same info string) at the start of the next; that added text counts toward the
    limit. Joining the pieces minus the added fence lines gives back the text (less
    whitespace that could not be attached to a piece); no piece is blank.
    """
    return [piece.text for piece in _split(text, limit, measure)]


def _split(text: str, limit: int, measure: Measure) -> list[_Piece]:
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    fences = _fences(text)
    reserve = max((measure("\n" + f.closer) for f in fences), default=0)
    pieces: list[_Piece] = []
    pos = 0
    while pos < len(text) and text[pos:].strip():
        inside = _inside(fences, pos)
        head = inside.opener + "\n" if inside else ""
        if measure(head + text[pos:]) <= limit:
            pieces.append(_Piece(head, text[pos:], ""))
            break
        cut, head, tail = _cut(text, pos, head, fences, limit - reserve, limit, measure)
        if text[pos:cut].strip():
            pieces.append(_Piece(head, text[pos:cut], tail))
        pos = cut
    return pieces


def _cut(
    text: str,
    pos: int,
    head: str,
    fences: list[_Fence],
    budget: int,
    limit: int,
    measure: Measure,
) -> tuple[int, str, str]:
    """Where the piece starting at `pos` ends, with its head and tail fence lines."""
    hi = _longest_fit(text, pos, head, budget, measure)
    fenced = True
    if hi <= pos:
        # Degenerate limit: not even one character fits beside the fence lines.
        head, fenced = "", False
        hi = _longest_fit(text, pos, "", limit, measure)
    while True:
        cut = _best_cut(text, pos, hi, fences) if hi > pos else pos + 1
        tail = ""
        fence = _inside(fences, cut) if fenced else None
        if fence is not None:
            tail = ("" if text[cut - 1] == "\n" else "\n") + fence.closer
        # The measure may not be additive (e.g. it measures converted markup): check.
        if cut == pos + 1 or measure(head + text[pos:cut] + tail) <= limit:
            return cut, head, tail
        hi = cut - 1


def _longest_fit(text: str, pos: int, head: str, budget: int, measure: Measure) -> int:
    """The largest `end` with `measure(head + text[pos:end]) <= budget` (pos if none)."""
    lo, hi = pos, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if measure(head + text[pos:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _best_cut(text: str, pos: int, hi: int, fences: list[_Fence]) -> int:
    def usable(cut: int) -> bool:
        return _allowed(text, fences, cut) and not text[pos:cut].isspace()

    half = pos + (hi - pos) // 2
    for sep, floor in (("\n\n", half), ("\n", half), (" ", half), ("\n", pos), (" ", pos)):
        end = hi
        while (found := text.rfind(sep, floor, end)) >= 0:
            cut = found + len(sep)
            if cut > pos and usable(cut):
                return cut
            end = cut - 1
    for cut in range(hi, pos, -1):
        if usable(cut):
            return cut
    return hi


def _inside(fences: list[_Fence], pos: int) -> _Fence | None:
    """The fence whose content a cut at `pos` falls in."""
    for fence in fences:
        if fence.start <= pos <= fence.end:
            return fence
    return None


def _allowed(text: str, fences: list[_Fence], cut: int) -> bool:
    """Whether cutting at `cut` keeps every fence line intact and creates no new one."""
    for fence in fences:
        if fence.line_start < cut <= fence.start or fence.end <= cut < fence.close_end:
            return False
    if text[cut - 1] == "\n":
        return True
    # A mid-line cut must not change what the line's first half means as a fence line
    # ("```x" cut to "```" would close a fence), nor start a new line that is one.
    line_start = text.rfind("\n", 0, cut) + 1
    line_end = text.find("\n", cut)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    before, after = line[: cut - line_start], line[cut - line_start :]
    return _fence_kind(before) == _fence_kind(line) and _FENCE_LINE.match(after) is None


def _fence_kind(line: str) -> tuple[str, str] | None:
    """(marker, "open" or "fence") for a line that can open only / open or close a fence."""
    m = _opens(line.rstrip("\r"))
    if m is None:
        return None
    return (m[2], "open" if m[3].strip() else "fence")


# ---- Markdown conversion -----------------------------------------------------------------

_PROTECT = re.compile(
    r"(?P<code>(?P<ticks>`+)(?P<code_text>.+?)(?P=ticks))"
    r"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>[^)\s]+)(?:\s+\"[^\"\n]*\")?\))"
    r"|<(?P<autolink>https?://[^\s<>]+)>"
    r"|(?P<url>(?<![\w/])https?://[^\s<>]*[^\s<>.,;:!?)\]'\"*_~])"
    r"|(?P<escaped>\\[\\`*_{}\[\]()#+\-.!~|>])"
)
_EMPHASIS = re.compile(
    r"(?P<bold_italic>\*\*\*(?=\S)(?P<bold_italic_text>.+?)(?<=\S)\*\*\*)"
    r"|(?P<bold>\*\*(?=\S)(?P<bold_text>.+?)(?<=\S)\*\*)"
    r"|(?P<bold2>(?<!\w)__(?=\S)(?P<bold2_text>.+?)(?<=\S)__(?!\w))"
    r"|(?P<strike>~~(?=\S)(?P<strike_text>.+?)(?<=\S)~~)"
    r"|(?P<italic>(?<![\w*])\*(?=[^\s*])(?P<italic_text>.+?)(?<=[^\s*])\*(?![\w*]))"
    r"|(?P<italic2>(?<![\w_])_(?=[^\s_])(?P<italic2_text>.+?)(?<=[^\s_])_(?![\w_]))"
)
_SLOT = re.compile("\ue000(\\d+)\ue001")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(?=\S)")
_QUOTE = re.compile(r"^[ \t]{0,3}>[ \t]?")
_WHOLE_BOLD = re.compile(r"^(?:\*\*(.+)\*\*|__(.+)__)$")


@dataclass(frozen=True, slots=True)
class _Dialect:
    escape: Callable[[str], str]
    code: Callable[[str], str]
    pre: Callable[[str, str], str]  # (language, code)
    bold: Callable[[str], str]
    italic: Callable[[str], str]
    strike: Callable[[str], str]
    link: Callable[[str, str], str]  # (converted text, raw url)
    url: Callable[[str], str]
    bullet: str
    quote: Callable[[list[str]], str]  # converted lines of one quote block


def _inline(text: str, d: _Dialect) -> str:
    """Convert the inline Markdown of one line."""
    slots: list[str] = []

    def protect(m: re.Match[str]) -> str:
        if m["code"]:
            rendered = d.code(m["code_text"])
        elif m["link"]:
            rendered = d.link(_inline(m["link_text"], d), m["link_url"])
        elif m["autolink"] or m["url"]:
            rendered = d.url(m["autolink"] or m["url"])
        else:
            rendered = d.escape(m["escaped"][1])
        slots.append(rendered)
        return f"\ue000{len(slots) - 1}\ue001"

    converted = _emphasis(_PROTECT.sub(protect, text), d)
    return _SLOT.sub(lambda m: slots[int(m[1])], converted)


def _emphasis(text: str, d: _Dialect) -> str:
    out: list[str] = []
    pos = 0
    while (m := _EMPHASIS.search(text, pos)) is not None:
        out.append(d.escape(text[pos : m.start()]))
        kind = m.lastgroup or ""
        inner = _emphasis(m[f"{kind}_text"], d)
        if kind == "bold_italic":
            out.append(d.bold(d.italic(inner)))
        elif kind in ("bold", "bold2"):
            out.append(d.bold(inner))
        elif kind == "strike":
            out.append(d.strike(inner))
        else:
            out.append(d.italic(inner))
        pos = m.end()
    out.append(d.escape(text[pos:]))
    return "".join(out)


def _prose(text: str, d: _Dialect) -> str:
    """Convert Markdown outside code fences, line by line."""
    out: list[str] = []
    quote: list[str] = []
    for line in text.split("\n"):
        if (m := _QUOTE.match(line)) is not None:
            quote.append(_inline(line[m.end() :], d))
            continue
        if quote:
            out.append(d.quote(quote))
            quote = []
        if (m := _HEADING.match(line)) is not None:
            title = m[1]
            if (whole := _WHOLE_BOLD.match(title)) is not None:
                title = whole[1] or whole[2]
            out.append(d.bold(_inline(title, d)) if title.strip() else "")
        elif (m := _BULLET.match(line)) is not None:
            out.append(m[1] + d.bullet + _inline(line[m.end() :], d))
        else:
            out.append(_inline(line, d))
    if quote:
        out.append(d.quote(quote))
    return "\n".join(out)


def _convert(md: str, d: _Dialect) -> str:
    out: list[str] = []
    pos = 0
    for fence in _fences(md):
        out.append(_prose(md[pos : fence.line_start], d))
        code = md[fence.start : fence.end]
        out.append(d.pre(fence.lang, code.removesuffix("\n")))
        if md[fence.close_end - 1 : fence.close_end] == "\n" and fence.close_end > fence.end:
            out.append("\n")
        pos = fence.close_end
    if pos < len(md):
        out.append(_prose(md[pos:], d))
    return "".join(out)


def _html(text: str) -> str:
    return html.escape(text, quote=False)


def _telegram_pre(lang: str, code: str) -> str:
    if lang:
        return f'<pre><code class="language-{html.escape(lang)}">{_html(code)}</code></pre>'
    return f"<pre>{_html(code)}</pre>"


_TELEGRAM = _Dialect(
    escape=_html,
    code=lambda code: f"<code>{_html(code)}</code>",
    pre=_telegram_pre,
    bold=lambda s: f"<b>{s}</b>",
    italic=lambda s: f"<i>{s}</i>",
    strike=lambda s: f"<s>{s}</s>",
    link=lambda label, url: f'<a href="{html.escape(url)}">{label}</a>',
    url=_html,
    bullet="• ",
    quote=lambda lines: "<blockquote>" + "\n".join(lines) + "</blockquote>",
)


def to_telegram_html(md: str) -> str:
    """Markdown → Telegram HTML (`parse_mode="HTML"`): <b>, <i>, <s>, <code>, <pre>,
    <a href>, <blockquote>; `&`, `<`, `>` escaped everywhere else."""
    return _convert(md, _TELEGRAM)


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Slack decodes &amp; &lt; &gt; everywhere, code included, and would read a raw "<" in
# code as the start of a link or mention, so code is escaped too.
_SLACK = _Dialect(
    escape=_slack_escape,
    code=lambda code: f"`{_slack_escape(code)}`",
    pre=lambda _lang, code: f"```\n{_slack_escape(code)}\n```",
    bold=lambda s: f"*{s}*",
    italic=lambda s: f"_{s}_",
    strike=lambda s: f"~{s}~",
    link=lambda label, url: f"<{_slack_escape(url)}|{label}>",
    url=_slack_escape,
    bullet="• ",
    quote=lambda lines: "\n".join("> " + line for line in lines),
)


def to_slack_mrkdwn(md: str) -> str:
    """Markdown → Slack mrkdwn: **b** → *b*, *i*/_i_ → _i_, ~~s~~ → ~s~, [t](u) → <u|t>,
    headings → bold lines; code kept; `&`, `<`, `>` escaped."""
    return _convert(md, _SLACK)


_DEEP_HEADING = re.compile(r"^ {0,3}#{4,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")


def to_discord(md: str) -> str:
    """Markdown → Discord Markdown: the same, except headings below ### become bold
    lines (Discord renders only #, ## and ###)."""
    out: list[str] = []
    pos = 0
    for fence in _fences(md):
        out.append(_discord_prose(md[pos : fence.line_start]))
        out.append(md[fence.line_start : fence.close_end])
        pos = fence.close_end
    out.append(_discord_prose(md[pos:]))
    return "".join(out)


def _discord_prose(text: str) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if (m := _DEEP_HEADING.match(line)) is not None and m[1]:
            title = m[1]
            whole = _WHOLE_BOLD.match(title)
            lines[i] = title if whole else f"**{title}**"
    return "\n".join(lines)
