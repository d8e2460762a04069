"""Splitting replies over platform limits and converting Markdown (channels/text.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from channels import discord_reply, slack_api, telegram_reply
from channels.text import (
    _split,
    _tables_laid_out,
    render_tables,
    split_message,
    to_discord,
    to_slack_mrkdwn,
    to_telegram_html,
    utf8_len,
)

FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")


def fences_balanced(text: str) -> bool:
    """CommonMark fence pairing: every opened fence is closed within `text`."""
    opened: str | None = None
    for line in text.split("\n"):
        m = FENCE_LINE.match(line)
        if m is None:
            continue
        marker, info = m[1], m[2]
        if opened is None:
            if not (marker[0] == "`" and "`" in info):
                opened = marker
        elif marker[0] == opened[0] and len(marker) >= len(opened) and not info.strip():
            opened = None
    return opened is None


def assert_split_ok(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    pieces = split_message(text, limit, measure)
    text, tables = _tables_laid_out(text)  # what is split: the text with tables laid out
    parts = _split(text, limit, measure, tables)
    assert pieces == [part.text for part in parts]
    for piece in pieces:
        assert measure(piece) <= limit, (measure(piece), limit)
        assert piece.strip(), "blank piece"
    # Only fence lines are added: the head reopens a fence, the tail closes one.
    for part in parts:
        assert part.head == "" or (
            part.head.endswith("\n") and FENCE_LINE.match(part.head[:-1]) is not None
        )
        assert part.tail == "" or re.fullmatch(r"\n?[ \t]*(`{3,}|~{3,})", part.tail)
    # The bodies are the text, in order, less whitespace runs that could not be attached.
    pos = 0
    for part in parts:
        found = text.find(part.body, pos)
        assert found >= 0
        assert not text[pos:found].strip()
        pos = found + len(part.body)
    assert not text[pos:].strip()
    bodies = "".join(part.body for part in parts)
    assert re.sub(r"\s+", "", bodies) == re.sub(r"\s+", "", text)
    return pieces


def long_answer() -> str:
    intro = "\n\n".join(
        f"Paragraph {i}: " + " ".join(f"word{j}" for j in range(40)) for i in range(4)
    )
    code = "\n".join(f"    result_{i} = compute({i}, flag=True)  # step {i}" for i in range(60))
    outro = "\n".join(f"- point {i}: " + "and more " * 8 for i in range(18))
    return f"{intro}\n\nHere is the code:\n\n```python\ndef main():\n{code}\n```\n\n{outro}\n"


@pytest.mark.parametrize("limit", [2000, 4096])
def test_long_answer_with_code_block_is_split_within_limit(limit: int) -> None:
    text = long_answer()
    assert 5500 < len(text) < 6500
    pieces = assert_split_ok(text, limit)
    assert len(pieces) == -(-len(text) // limit) or len(pieces) == -(-len(text) // limit) + 1
    for piece in pieces:
        assert fences_balanced(piece), piece
    code_pieces = [p for p in pieces if "result_" in p]
    if limit == 2000:  # the code block (~3000 chars) cannot fit one piece: reopened
        assert len(code_pieces) >= 2
        assert code_pieces[1].startswith("```python\n")
        assert code_pieces[0].endswith("\n```")
    # Exact reconstruction: drop added fence lines and the text comes back.
    parts = _split(text, limit, len)
    assert "".join(part.body for part in parts) == text


def test_short_and_empty_texts() -> None:
    assert split_message("hello", 10) == ["hello"]
    assert split_message("", 10) == []
    assert split_message(" \n\n ", 10) == []
    with pytest.raises(ValueError, match="limit"):
        split_message("hello", 0)


def test_cuts_at_paragraph_then_line_then_word_then_anywhere() -> None:
    para = "aaaa bbbb\ncccc dddd\n\neeee ffff"
    assert split_message(para, 22) == ["aaaa bbbb\ncccc dddd\n\n", "eeee ffff"]
    lines = "aaaa bbbb\ncccc dddd\neeee ffff"
    assert split_message(lines, 22) == ["aaaa bbbb\ncccc dddd\n", "eeee ffff"]
    words = "aaaa bbbb cccc dddd eeee"
    assert split_message(words, 12) == ["aaaa bbbb ", "cccc dddd ", "eeee"]
    assert split_message("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


# The case: ~8,000 characters of numbered sentences and no newline, which
# Telegram got cut mid-sentence ("…topic 61. Sentence number 62 says").
PARAGRAPH = " ".join(f"Sentence number {i} says something about topic {i}." for i in range(158))

PLATFORM_LIMITS = [
    pytest.param(telegram_reply.MESSAGE_LIMIT, telegram_reply._utf16_len, id="telegram"),
    pytest.param(discord_reply.MESSAGE_LIMIT, len, id="discord"),
    pytest.param(slack_api.LIMIT_BYTES, slack_api.slack_size, id="slack"),
]


@pytest.mark.parametrize(("limit", "measure"), PLATFORM_LIMITS)
def test_long_paragraph_is_cut_at_sentence_ends_on_every_platform(
    limit: int, measure: Callable[[str], int]
) -> None:
    assert 7900 < len(PARAGRAPH) < 8100
    pieces = assert_split_ok(PARAGRAPH, limit, measure)
    for piece in pieces[:-1]:  # each as full as a whole number of sentences allows
        assert measure(piece) > limit - len("Sentence number 157 says something about topic 157. ")
    for piece in pieces:
        assert re.fullmatch(r"Sentence number \d+ .* topic \d+\. ?", piece), piece[-40:]


def test_sentence_ends_rank_between_line_breaks_and_spaces() -> None:
    assert split_message("Aaa bbb. Ccc ddd eee", 14) == ["Aaa bbb. ", "Ccc ddd eee"]
    assert split_message("Aaa. Bbb\nccc ddd. Eee", 16) == ["Aaa. Bbb\n", "ccc ddd. Eee"]
    assert split_message('He said "stop!" Then we left', 20) == ['He said "stop!" ', "Then we left"]
    assert split_message("Really, why? Who knows", 16) == ["Really, why? ", "Who knows"]
    assert split_message("これは文です。これも文です。", 10) == ["これは文です。", "これも文です。"]


def test_abbreviations_and_initials_end_no_sentence() -> None:
    # Each has a sentence end early in the window and an abbreviation later on.
    assert split_message("Some words here. Ok. Mr. Smith came", 28) == [
        "Some words here. Ok. ",
        "Mr. Smith came",
    ]
    assert split_message("Some words here. Ok. e.g. this one", 28)[0] == "Some words here. Ok. "
    assert split_message("Some words here. Ok. J. Smith came", 28)[0] == "Some words here. Ok. "
    # Numbers end sentences ("topic 61. Sentence …"); decimals do not (no space).
    assert split_message("Aaaa topic 61. Then 3.5 x", 20) == ["Aaaa topic 61. ", "Then 3.5 x"]


def test_reopened_fence_counts_toward_limit() -> None:
    text = "```python\n" + "\n".join(f"line{i:03}" for i in range(30)) + "\n```"
    pieces = assert_split_ok(text, 60)
    assert len(pieces) > 2
    for piece in pieces:
        assert piece.startswith("```python\n")
        assert piece.endswith("```")
        assert fences_balanced(piece)
        assert len(piece) <= 60


def test_mid_line_cut_never_creates_a_fence_line() -> None:
    text = "word " * 5 + "``` is how a fence starts, and ~~~ too " * 3
    for limit in range(8, 40):
        for piece in assert_split_ok(text, limit):
            assert fences_balanced(piece), (limit, piece)


def test_utf8_measure() -> None:
    text = "Привет, мир! 😀 " * 200
    pieces = assert_split_ok(text, 3000, utf8_len)
    assert len(pieces) > 1
    assert all(utf8_len(p) <= 3000 for p in pieces)


# ---- property tests ----------------------------------------------------------------------

_WORD = st.one_of(
    st.text(alphabet="abcxyz*_#>-.éЖ😀", min_size=1, max_size=14),
    st.sampled_from(["`code`", "~~gone~~", "**bold**", "[a](https://e.x/a_b)"]),
)
_LINE = st.lists(_WORD, min_size=1, max_size=10).map(" ".join)
_PARAGRAPH = st.lists(_LINE, min_size=1, max_size=4).map("\n".join)
_CODE_LINE = st.one_of(_LINE, st.just(""), st.just("```not-a-closer"), st.just("  ~~~x"))


@st.composite
def _code_block(draw: st.DrawFn) -> str:
    marker = draw(st.sampled_from(["```", "````", "~~~"]))
    lang = draw(st.sampled_from(["", "python", "js"]))
    lines = draw(st.lists(_CODE_LINE, max_size=10))
    return f"{marker}{lang}\n" + "".join(line + "\n" for line in lines) + marker


_DOCUMENT = st.lists(st.one_of(_PARAGRAPH, _code_block()), min_size=1, max_size=8).map("\n\n".join)


@settings(max_examples=300, deadline=None)
@given(
    text=_DOCUMENT,
    limit=st.integers(min_value=24, max_value=400),
    measure=st.sampled_from([len, utf8_len]),
)
def test_split_property_markdown(text: str, limit: int, measure: Callable[[str], int]) -> None:
    assert fences_balanced(text)
    for piece in assert_split_ok(text, limit, measure):
        assert fences_balanced(piece), piece
    assert "".join(part.body for part in _split(text, limit, measure)) == text


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=600), limit=st.integers(min_value=1, max_value=120))
def test_split_property_any_text(text: str, limit: int) -> None:
    assert_split_ok(text, limit)


# ---- Markdown conversion -----------------------------------------------------------------

SAMPLE = """# Title & more
Some **bold**, *italic*, _also italic_, ~~struck~~ and `x < y && z` here.
See [the docs](https://ex.com/?a=1&b=2) or https://ex.com/some_path_here.
- item with snake_case_name
> quoted *line*

```python
if a < b and c > d:
    print("**not bold** & _not italic_")
```
2 * 3 * 4 < 5 & done"""


def test_to_telegram_html() -> None:
    html = to_telegram_html(SAMPLE)
    assert html.splitlines()[0] == "<b>Title &amp; more</b>"
    assert (
        "Some <b>bold</b>, <i>italic</i>, <i>also italic</i>, <s>struck</s> and "
        "<code>x &lt; y &amp;&amp; z</code> here." in html
    )
    assert '<a href="https://ex.com/?a=1&amp;b=2">the docs</a>' in html
    assert "https://ex.com/some_path_here." in html
    assert "• item with snake_case_name" in html
    assert "<blockquote>quoted <i>line</i></blockquote>" in html
    assert (
        '<pre><code class="language-python">if a &lt; b and c &gt; d:\n'
        '    print("**not bold** &amp; _not italic_")</code></pre>'
    ) in html
    assert html.endswith("2 * 3 * 4 &lt; 5 &amp; done")


def test_telegram_html_nests_and_leaves_unmatched_markers() -> None:
    assert to_telegram_html("**bold _and italic_**") == "<b>bold <i>and italic</i></b>"
    assert to_telegram_html("***both***") == "<b><i>both</i></b>"
    assert to_telegram_html("**open only") == "**open only"
    assert to_telegram_html("a <b>tag</b>") == "a &lt;b&gt;tag&lt;/b&gt;"
    assert to_telegram_html("\\*not italic\\*") == "*not italic*"
    assert to_telegram_html("```\nplain <code>\n```") == "<pre>plain &lt;code&gt;</pre>"
    assert to_telegram_html("```sh\nunclosed") == (
        '<pre><code class="language-sh">unclosed</code></pre>'
    )


def test_to_slack_mrkdwn() -> None:
    out = to_slack_mrkdwn(SAMPLE)
    assert out.splitlines()[0] == "*Title &amp; more*"
    assert "Some *bold*, _italic_, _also italic_, ~struck~ and `x &lt; y &amp;&amp; z` here." in out
    assert "<https://ex.com/?a=1&amp;b=2|the docs>" in out
    assert "https://ex.com/some_path_here." in out
    assert "• item with snake_case_name" in out
    assert "> quoted _line_" in out
    assert "```\nif a &lt; b and c &gt; d:\n" in out
    assert 'print("**not bold** &amp; _not italic_")\n```' in out
    assert out.endswith("2 * 3 * 4 &lt; 5 &amp; done")
    assert to_slack_mrkdwn("## **Bold heading**") == "*Bold heading*"


def test_to_discord_keeps_markdown_and_bolds_deep_headings() -> None:
    md = "# One\n### Three\n#### Four\n##### **Five**\n```\n#### not a heading\n```\n**b** _i_"
    assert to_discord(md) == (
        "# One\n### Three\n**Four**\n**Five**\n```\n#### not a heading\n```\n**b** _i_"
    )
    assert to_discord(SAMPLE) == SAMPLE


def test_utf8_len() -> None:
    assert utf8_len("aé😀") == 1 + 2 + 4


# ---- tables ------------------------------------------------------------------------------

TABLE = """Compare:

| Tool | Use | Cost |
|:-----|:---:|-----:|
| **hammer** | nails & <pins> | 12 |
| `saw` | [wood](https://ex.com/w) | 7.5 |

Pick one."""

TABLE_LINES = [
    "Tool              Use            Cost",
    "------  -----------------------  ----",
    "hammer      nails & <pins>         12",
    "saw     wood (https://ex.com/w)   7.5",
]

WIDE_TABLE = """| Host | Purpose | Notes |
|---|---|---|
| db-1 | primary **database** | replicated to [db-2](https://ex.com/db-2) every 5 min |
| web-1 | front end | |"""


def test_table_becomes_an_aligned_block_on_every_platform() -> None:
    block = "\n".join(TABLE_LINES)
    escaped = block.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert to_telegram_html(TABLE) == f"Compare:\n\n<pre>{escaped}</pre>\n\nPick one."
    assert to_slack_mrkdwn(TABLE) == f"Compare:\n\n```\n{escaped}\n```\n\nPick one."
    assert to_discord(TABLE) == f"Compare:\n\n```\n{block}\n```\n\nPick one."
    assert render_tables(TABLE) == to_discord(TABLE)
    # Aligned: the gaps between columns (spaces in the rule line) are spaces on every
    # line, and the right-aligned last column ends where the rule does.
    gaps = [k for k, char in enumerate(TABLE_LINES[1]) if char == " "]
    assert gaps == [6, 7, 31, 32]
    assert all(line[k] == " " for line in TABLE_LINES for k in gaps)
    assert {len(line) for line in TABLE_LINES} == {len(TABLE_LINES[1])}
    # Only tables are touched: not one in a code fence, nor near misses.
    fenced = "```\n| a | b |\n|---|---|\n| 1 | 2 |\n```"
    assert render_tables(fenced) == fenced
    assert to_discord(fenced) == fenced
    for text in ("a | b\nc | d", "| a | b |\n|---|\n| 1 | 2 |", "Title\n---", "x | y\n- | -z"):
        assert render_tables(text) == text


def test_wide_table_is_written_out_one_cell_per_line() -> None:
    lines = [
        "**Host**: db-1",
        "**Purpose**: primary **database**",
        "**Notes**: replicated to [db-2](https://ex.com/db-2) every 5 min",
        "",
        "**Host**: web-1",
        "**Purpose**: front end",
    ]
    assert render_tables(WIDE_TABLE) == "\n".join(lines)
    assert to_discord(WIDE_TABLE) == "\n".join(lines)
    assert to_telegram_html(WIDE_TABLE).splitlines()[:3] == [
        "<b>Host</b>: db-1",
        "<b>Purpose</b>: primary <b>database</b>",
        '<b>Notes</b>: replicated to <a href="https://ex.com/db-2">db-2</a> every 5 min',
    ]
    assert to_slack_mrkdwn(WIDE_TABLE).splitlines()[4] == "*Host*: web-1"
    # The same table, narrow enough, stays a table.
    narrow = WIDE_TABLE.replace("replicated to [db-2](https://ex.com/db-2) every 5 min", "copied")
    assert render_tables(narrow).startswith("```\nHost   Purpose           Notes\n")


def test_table_moves_to_the_next_piece_rather_than_being_cut() -> None:
    prose = " ".join(f"Word{i}" for i in range(50))  # ~340 characters
    rows = "\n".join(f"| item {i} | {i * 7} |" for i in range(12))
    text = f"{prose}\n\n| Item | Count |\n|---|--:|\n{rows}\n\nThe end."
    block = render_tables(text)[len(prose) + 2 : -len("\n\nThe end.")]
    assert block.startswith("```\nItem")
    assert len(block) < 250
    pieces = assert_split_ok(text, 500)
    assert pieces[0] == prose + "\n\n"
    assert pieces[1].startswith(block)


def test_table_larger_than_a_piece_is_cut_between_rows() -> None:
    rows = "\n".join(f"| item {i} | {i * 7} |" for i in range(80))
    pieces = assert_split_ok(f"| Item | Count |\n|---|--:|\n{rows}", 300)
    assert len(pieces) > 3
    for piece in pieces:
        assert piece.startswith("```\n")
        assert piece.endswith("\n```")
        assert fences_balanced(piece)
        assert re.fullmatch(r"```\n(?:(?:Item|item \d+|-+) +[-\w]+\n)+```", piece), piece


_CELL = st.one_of(
    st.text(alphabet="abcxyz &<>*_`-.é😀界", max_size=12),
    st.sampled_from(["`code`", "**bold**", "[a](https://e.x/a_b)", "a \\| b", ""]),
)


@st.composite
def _table(draw: st.DrawFn) -> str:
    columns = draw(st.integers(min_value=1, max_value=5))
    row = st.lists(_CELL, min_size=1, max_size=columns + 1).map(lambda c: "| " + " | ".join(c))
    header = "| " + " | ".join(draw(st.lists(_CELL, min_size=columns, max_size=columns))) + " |"
    delimiter = "|" + "|".join(
        draw(st.sampled_from(["---", ":--", "--:", ":-:"])) for _ in range(columns)
    )
    return "\n".join([header, delimiter, *draw(st.lists(row, max_size=8))])


_TABLE_DOCUMENT = st.lists(
    st.one_of(_PARAGRAPH, _code_block(), _table()), min_size=1, max_size=6
).map("\n\n".join)
_RAW_ROW = re.compile(r"^\s*\|.*\|\s*$|^\|?\s*:?-+:?\s*\|", re.M)


@settings(max_examples=200, deadline=None)
@given(text=_TABLE_DOCUMENT, limit=st.integers(min_value=40, max_value=600))
# A cell reading ``` in a table written out by row opened a fence in the prose.
@example(
    text=">\n\n|  |  |  |  |  |\n|---|---|---|---|---\n"
    "| ``` | <<界界 | <<<<<<<<<<<界 | <<<<<<<<<<界界 | [a](https://e.x/a_b)",
    limit=40,
)
def test_split_property_tables(text: str, limit: int) -> None:
    laid_out = render_tables(text)
    assert render_tables(laid_out) == laid_out
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", laid_out, flags=re.M | re.S)
    assert _RAW_ROW.search(prose) is None, laid_out
    for piece in assert_split_ok(text, limit):
        assert fences_balanced(piece), piece
