"""Fenced code blocks in Markdown replies, located the way CommonMark pairs them.

Splitting (channels/text.py) must never break a fence line and must close and reopen a
fence it cuts through; the converters must leave fence content alone. Both need the same
idea of where fences are, so it lives here.
"""

from __future__ import annotations

import re

from core.records import record

# A fence line: up to any indentation (models indent fences inside list items), three or
# more backticks or tildes, then the info string (or nothing, for a closing line).
FENCE_LINE = re.compile(r"^([ \t]*)(`{3,}|~{3,})([^\n]*)$")


@record(frozen=True, slots=True)
class Fence:
    """A fenced code block of some text; its content is `text[start:end]`."""

    opener: str  # the opening line without its newline, e.g. "```python"
    closer: str  # the line that closes it, e.g. "```"
    lang: str
    line_start: int  # where the opening line starts
    start: int  # first content index (after the opening line's newline)
    end: int  # where the closing line starts (len(text) when unclosed)
    close_end: int  # after the closing line and its newline (len(text) when unclosed)


def opens(line: str) -> re.Match[str] | None:
    """The fence-line match if `line` can open a fence, else None."""
    m = FENCE_LINE.match(line)
    # CommonMark: a backtick fence's info string has no backticks ("```x```" is inline code).
    if m is None or (m[2][0] == "`" and "`" in m[3]):
        return None
    return m


def _closes(line: str, opener: re.Match[str]) -> bool:
    m = FENCE_LINE.match(line)
    return (
        m is not None
        and m[2][0] == opener[2][0]
        and len(m[2]) >= len(opener[2])
        and not m[3].strip()
    )


def find_fences(text: str) -> list[Fence]:
    """The fenced code blocks of `text`, in order; the last may be unclosed."""
    fences: list[Fence] = []
    opened: tuple[int, int, re.Match[str]] | None = None
    pos, n = 0, len(text)
    while pos < n:
        newline = text.find("\n", pos)
        line_end = n if newline < 0 else newline + 1
        line = text[pos:line_end].rstrip("\n")
        if opened is None:
            m = opens(line)
            if m is not None:
                opened = (pos, line_end, m)
        elif _closes(line, opened[2]):
            fences.append(_fence(opened, end=pos, close_end=line_end))
            opened = None
        pos = line_end
    if opened is not None:
        fences.append(_fence(opened, end=n, close_end=n))
    return fences


def _fence(opened: tuple[int, int, re.Match[str]], *, end: int, close_end: int) -> Fence:
    line_start, start, m = opened
    info = m[3].strip()
    return Fence(
        opener=m[0].rstrip("\r"),
        closer=m[1] + m[2],
        lang=info.split()[0] if info else "",
        line_start=line_start,
        start=start,
        end=end,
        close_end=close_end,
    )


def inside(fences: list[Fence], pos: int) -> Fence | None:
    """The fence whose content a cut at `pos` falls in."""
    for fence in fences:
        if fence.start <= pos <= fence.end:
            return fence
    return None
