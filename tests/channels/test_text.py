"""Splitting replies over platform limits and converting Markdown (channels/text.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.text import (
    _split,
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
    parts = _split(text, limit, measure)
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
