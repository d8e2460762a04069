"""Markdown (GFM) tables laid out for chat platforms, none of which renders them.

A table becomes a fenced code block with aligned columns: the header, a dashed rule, the
rows. Monospace shows markup literally, so cell markup is first reduced to plain text (by
the `plain` function the caller passes: channels/text.py owns the inline syntax). Each
platform's converter then turns the fence into its own block (Telegram `<pre>`, Slack and
Discord ``` blocks).

Where that block would be wider than `TABLE_WIDTH` columns, the table becomes one
"column: value" line per non-empty cell instead, a blank line between rows, with the cell
markup kept for the converter (links stay clickable); a line that would open a code fence
(a cell reading ``` or ~~~) has its fence marker backslash-escaped, as CommonMark allows,
so it shows as typed and no fence swallows the rest of the reply.

60 columns: a code block wider than its message area wraps or scrolls, and a wrapped
aligned table is harder to read than the line-per-cell form. Slack's thread pane and
Discord's and Telegram's desktop message columns show about 60 to 80 monospace columns
before wrapping; 60 keeps tables aligned in the narrowest of these. (Phones wrap or scroll
from about 35 columns whatever we choose.)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Literal

from channels.fences import opens
from core.records import record

TABLE_WIDTH = 60
"""Widest aligned table, in monospace columns; wider tables are written out by row."""

Align = Literal["left", "right", "center"]
Row = tuple[str, ...] | None  # a row's cells (raw Markdown), or None for a rule row

_PIPE = re.compile(r"(?<!\\)\|")
_DELIMITER_CELL = re.compile(r"^:?-+:?$")
_BACKTICKS = re.compile(r"^[ \t]*(`+)")
_GAP = "  "  # between columns


@record(frozen=True, slots=True)
class Table:
    """A GFM table found in some text: its lines are `text[start:end]`."""

    start: int
    end: int  # after the last row's newline (or the end of the text)
    header: tuple[str, ...]
    aligns: tuple[Align, ...]
    rows: tuple[Row, ...]


def lay_out_tables(
    text: str, plain: Callable[[str], str], width: int = TABLE_WIDTH
) -> tuple[str, list[tuple[int, int]]]:
    """`text` with each table laid out (see the module docstring), and where each laid-out
    table is in the result (`(start, end)`). `text` must hold no code fence."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = size = 0
    for table in find_tables(text):
        before = text[pos : table.start]
        block = lay_out(table, plain, width)
        if text[table.start : table.end].endswith("\n"):
            block += "\n"
        out += [before, block]
        size += len(before)
        spans.append((size, size + len(block)))
        size += len(block)
        pos = table.end
    out.append(text[pos:])
    return "".join(out), spans


def find_tables(text: str) -> list[Table]:
    """The GFM tables of `text`: a header row and a delimiter row (`|---|:-:|`) with as
    many cells, then rows until a blank line or a line with no `|` (GFM would take such
    a line as a row; in chat it is the prose after a table)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    tables: list[Table] = []
    i = 0
    while i + 1 < len(lines):
        header = _cells(lines[i])
        aligns = _aligns(lines[i + 1], len(header)) if header else None
        if header is None or aligns is None:
            i += 1
            continue
        rows: list[Row] = []
        j = i + 2
        while j < len(lines) and lines[j].strip() and (cells := _cells(lines[j])) is not None:
            rule = _aligns(lines[j], len(cells)) is not None
            rows.append(None if rule else _fit(cells, len(header)))
            j += 1
        end = min(starts[j], len(text))
        tables.append(Table(starts[i], end, tuple(header), aligns, tuple(rows)))
        i = j
    return tables


def _cells(line: str) -> list[str] | None:
    """The cells of a table row (escaped pipes unescaped), or None if it has no `|`."""
    row = line.strip()
    if _PIPE.search(row) is None:
        return None
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.strip().replace("\\|", "|") for cell in _PIPE.split(row)]


def _aligns(line: str, count: int) -> tuple[Align, ...] | None:
    """The column alignments if `line` is a delimiter row of `count` cells, else None."""
    cells = _cells(line)
    if cells is None or len(cells) != count or not all(map(_DELIMITER_CELL.match, cells)):
        return None
    return tuple(_align(cell) for cell in cells)


def _align(delimiter: str) -> Align:
    if delimiter.endswith(":"):
        return "center" if delimiter.startswith(":") else "right"
    return "left"


def _fit(cells: list[str], count: int) -> tuple[str, ...]:
    """GFM: missing cells are empty, extra cells are dropped."""
    return tuple(cells[:count] + [""] * (count - len(cells)))


def lay_out(table: Table, plain: Callable[[str], str], width: int = TABLE_WIDTH) -> str:
    """Markdown for `table`: an aligned fenced block if it fits `width`, else by row."""
    lines = _aligned(table, plain)
    if max(map(display_width, lines)) <= width:
        return _fenced(lines)
    return _by_row(table)


def _aligned(table: Table, plain: Callable[[str], str]) -> list[str]:
    def text(cells: tuple[str, ...]) -> list[str]:
        return [plain(cell).replace("\t", " ") for cell in cells]

    header = text(table.header)
    body = [None if row is None else text(row) for row in table.rows]
    grid = [header, *(row for row in body if row is not None)]
    widths = [max([1, *(display_width(row[k]) for row in grid)]) for k in range(len(header))]
    rule = _GAP.join("-" * w for w in widths)

    def line(cells: list[str]) -> str:
        padded = (_pad(cell, w, a) for cell, w, a in zip(cells, widths, table.aligns, strict=True))
        return _GAP.join(padded).rstrip()

    return [line(header), rule, *(rule if row is None else line(row) for row in body)]


def _pad(cell: str, width: int, align: Align) -> str:
    gap = width - display_width(cell)
    if align == "right":
        return " " * gap + cell
    if align == "center":
        return " " * (gap // 2) + cell + " " * (gap - gap // 2)
    return cell + " " * gap


def _fenced(lines: list[str]) -> str:
    # A fence of backticks longer than any run starting a line, so no line closes it.
    runs = [len(m[1]) for line in lines if (m := _BACKTICKS.match(line)) is not None]
    marker = "`" * max([3, *(run + 1 for run in runs)])
    return "\n".join([marker, *lines, marker])


def _by_row(table: Table) -> str:
    groups = []
    for row in table.rows:
        if row is None:
            continue
        lines = [
            _unfenced(f"{_label(name)}: {value}" if name else value)
            for name, value in zip(table.header, row, strict=True)
            if value
        ]
        if lines:
            groups.append("\n".join(lines))
    if not groups:  # a table of headers only
        return "\n".join(_unfenced(_label(name)) for name in table.header if name)
    return "\n\n".join(groups)


def _unfenced(line: str) -> str:
    """`line`, with its fence marker backslash-escaped if it would open a code fence (a cell
    reading ``` or ~~~): the by-row form is prose, where such a line would swallow the rest
    of the reply into a code block, and leave it unclosed. The converters and Discord show
    the escaped marker as typed."""
    m = opens(line)
    if m is None:
        return line
    return m[1] + "".join("\\" + char for char in m[2]) + line[m.end(2) :]


def _label(name: str) -> str:
    # Bold the column name, unless emphasis in it would collide with the added markers.
    return name if "*" in name else f"**{name}**"


def display_width(text: str) -> int:
    """Columns `text` takes in a monospace font: wide (CJK, most emoji) characters take
    two, combining marks and format characters none."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width
