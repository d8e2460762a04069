"""Reply text for chat platforms: splitting over the size limit and Markdown conversion.

Models answer in CommonMark-ish Markdown; each platform wants its own dialect and has a
per-message limit (docs/channels.md). `split_message` first lays out Markdown tables (no platform
renders them; channels/tables.py), then cuts at paragraph, line, sentence and word
boundaries (in that order), keeps a laid-out table in one piece where it fits, and never
leaves a code fence open in a piece: a cut inside a fence closes it and reopens it, with
the same info string, in the next piece. The converters lay out tables the same way.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator

from channels.fences import FENCE_LINE, Fence, find_fences, inside, opens
from channels.tables import TABLE_WIDTH, lay_out_tables
from core.records import record

Measure = Callable[[str], int]
Span = tuple[int, int]


def utf8_len(text: str) -> int:
    """Size of `text` in UTF-8 bytes (Slack's limits are in bytes)."""
    return len(text.encode("utf-8"))


# ---- splitting ---------------------------------------------------------------------------


@record(frozen=True, slots=True)
class _Piece:
    head: str  # a reopened fence line and newline, or ""
    body: str  # a slice of the original text
    tail: str  # a fence closing line added after the body, or ""

    @property
    def text(self) -> str:
        return self.head + self.body + self.tail


def split_message(text: str, limit: int, measure: Measure = len) -> list[str]:
    """Cut `text` into pieces with `measure(piece) <= limit`.

    Tables are laid out first (`render_tables`), as the converters will show them, so
    the measure sees what is sent. Cuts at paragraph ("\\n\\n") boundaries first, then
    lines, then sentence ends, then words, then anywhere, and before a laid-out table
    rather than inside one that fits a piece of its own. A cut inside a code fence closes
    the fence at the end of the piece and reopens it (same info string) at the start of
    the next; that added text counts toward the limit. Joining the pieces minus the added
    fence lines gives back the laid-out text (less whitespace that could not be attached
    to a piece); no piece is blank.
    """
    laid_out, tables = _tables_laid_out(text)
    return [piece.text for piece in _split(laid_out, limit, measure, tables)]


@record(frozen=True, slots=True)
class _Text:
    """The text being split, with what constrains where it may be cut."""

    text: str
    fences: list[Fence]
    whole: list[Span]  # blocks (laid-out tables) to move to the next piece, not cut


def _split(
    text: str, limit: int, measure: Measure, blocks: list[Span] | None = None
) -> list[_Piece]:
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    fences = find_fences(text)
    whole = [(a, b) for a, b in blocks or [] if measure(text[a:b]) <= limit]
    doc = _Text(text, fences, whole)
    reserve = max((measure("\n" + f.closer) for f in fences), default=0)
    pieces: list[_Piece] = []
    pos = 0
    while pos < len(text) and text[pos:].strip():
        fence = inside(fences, pos)
        head = fence.opener + "\n" if fence else ""
        if measure(head + text[pos:]) <= limit:
            pieces.append(_Piece(head, text[pos:], ""))
            break
        cut, head, tail = _cut(doc, pos, head, limit - reserve, limit, measure)
        if text[pos:cut].strip():
            pieces.append(_Piece(head, text[pos:cut], tail))
        pos = cut
    return pieces


def _cut(
    doc: _Text, pos: int, head: str, budget: int, limit: int, measure: Measure
) -> tuple[int, str, str]:
    """Where the piece starting at `pos` ends, with its head and tail fence lines."""
    text = doc.text
    hi = _longest_fit(text, pos, head, budget, measure)
    fenced = True
    if hi <= pos:
        # Degenerate limit: not even one character fits beside the fence lines.
        head, fenced = "", False
        hi = _longest_fit(text, pos, "", limit, measure)
    while True:
        cut = _best_cut(doc, pos, hi) if hi > pos else pos + 1
        tail = ""
        fence = inside(doc.fences, cut) if fenced else None
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


def _best_cut(doc: _Text, pos: int, hi: int) -> int:
    """The best cut in `(pos, hi]`: the last boundary of the strongest kind found in the
    window's second half, else anywhere in it; moved back to the start of a block that
    it would cut and that fits a piece of its own."""

    def usable(cut: int) -> bool:
        return _allowed(doc.text, doc.fences, cut) and not doc.text[pos:cut].isspace()

    cut = _boundary_cut(doc.text, pos, hi, usable)
    for start, end in doc.whole:
        if pos < start < cut < end and usable(start):
            return start
    return cut


def _boundary_cut(text: str, pos: int, hi: int, usable: Callable[[int], bool]) -> int:
    half = pos + (hi - pos) // 2
    for cuts, floor in (
        (_after("\n\n"), half),
        (_after("\n"), half),
        (_sentence_ends, half),
        (_after(" "), half),
        (_after("\n"), pos),
        (_sentence_ends, pos),
        (_after(" "), pos),
    ):
        for cut in cuts(text, floor, hi):
            if cut > pos and usable(cut):
                return cut
    for cut in range(hi, pos, -1):
        if usable(cut):
            return cut
    return hi


Cuts = Callable[[str, int, int], Iterator[int]]


def _after(sep: str) -> Cuts:
    """Cuts just after each `sep` lying in `text[floor:hi]`, last first."""

    def cuts(text: str, floor: int, hi: int) -> Iterator[int]:
        end = hi
        while (found := text.rfind(sep, floor, end)) >= 0:
            yield found + len(sep)
            end = found + len(sep) - 1

    return cuts


# A sentence end: terminal punctuation (and closing quotes or brackets) followed by
# whitespace, the cut going after the whitespace; CJK full stops need none.
_SENTENCE_END = re.compile(r"[.!?…‼⁇⁈⁉][.!?…\"'”’»)\]]*[ \t\n]+|[。！？｡][」』）\"'”’]*[ \t\n]*")
# A full stop after these (or after a single letter, an initial) ends no sentence.
_ABBREVIATIONS = frozenset(
    {"e.g", "i.e", "cf", "vs", "al", "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "fig"}
)


def _sentence_ends(text: str, floor: int, hi: int) -> Iterator[int]:
    """Cuts just after each sentence end lying in `text[floor:hi]`, last first."""
    found = [m.end() for m in _SENTENCE_END.finditer(text, floor, hi) if _ends_sentence(text, m)]
    return reversed(found)


def _ends_sentence(text: str, m: re.Match[str]) -> bool:
    if text[m.start()] != ".":
        return True
    start = m.start()
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "."):
        start -= 1
    word = text[start : m.start()].lower()
    return not (len(word) == 1 and word.isalpha()) and word not in _ABBREVIATIONS


def _allowed(text: str, fences: list[Fence], cut: int) -> bool:
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
    return _fence_kind(before) == _fence_kind(line) and FENCE_LINE.match(after) is None


def _fence_kind(line: str) -> tuple[str, str] | None:
    """(marker, "open" or "fence") for a line that can open only / open or close a fence."""
    m = opens(line.rstrip("\r"))
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


@record(frozen=True, slots=True)
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


def _plain_text(text: str) -> str:
    return text


# Cells of a laid-out table are shown in monospace, where markup would show literally.
_PLAIN = _Dialect(
    escape=_plain_text,
    code=_plain_text,
    pre=lambda _lang, code: code,
    bold=_plain_text,
    italic=_plain_text,
    strike=_plain_text,
    link=lambda label, url: label if label == url else f"{label} ({url})",
    url=_plain_text,
    bullet="",
    quote="\n".join,
)


def render_tables(md: str, width: int = TABLE_WIDTH) -> str:
    """Markdown with each table (outside code fences) laid out for chat: an aligned
    fenced block of plain text, or "column: value" lines where wider than `width`."""
    return _tables_laid_out(md, width)[0]


def _tables_laid_out(md: str, width: int = TABLE_WIDTH) -> tuple[str, list[Span]]:
    """`render_tables(md)`, and where each laid-out table is in it."""
    out: list[str] = []
    spans: list[Span] = []
    size = pos = 0
    fences = [(f.line_start, f.close_end) for f in find_fences(md)]
    for start, end in [*fences, (len(md), len(md))]:  # the prose before each fence, and after
        prose, found = lay_out_tables(md[pos:start], lambda cell: _inline(cell, _PLAIN), width)
        spans += [(size + a, size + b) for a, b in found]
        out += [prose, md[start:end]]
        size += len(prose) + end - start
        pos = end
    return "".join(out), spans


def _convert(md: str, d: _Dialect) -> str:
    md = render_tables(md)
    out: list[str] = []
    pos = 0
    for fence in find_fences(md):
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
    <a href>, <blockquote>; tables as aligned <pre> blocks (`render_tables`); `&`, `<`,
    `>` escaped everywhere else."""
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
    headings → bold lines, tables → aligned ``` blocks (`render_tables`); code kept; `&`,
    `<`, `>` escaped."""
    return _convert(md, _SLACK)


_DEEP_HEADING = re.compile(r"^ {0,3}#{4,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")


def to_discord(md: str) -> str:
    """Markdown → Discord Markdown: the same, except headings below ### become bold
    lines (Discord renders only #, ## and ###) and tables are laid out."""
    return bold_deep_headings(render_tables(md))


def bold_deep_headings(md: str) -> str:
    """Headings below ### as bold lines, outside code fences (Discord shows `####` as
    typed): for streamed previews as well as the final text."""
    out: list[str] = []
    pos = 0
    for fence in find_fences(md):
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
