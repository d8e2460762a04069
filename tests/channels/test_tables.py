"""Finding GFM tables and laying them out for chat (channels/tables.py). Cell text is
passed through unchanged here (`same`); channels/text.py supplies the markup stripping,
tested in test_text.py."""

from __future__ import annotations

from channels.tables import TABLE_WIDTH, display_width, find_tables, lay_out_tables


def same(cell: str) -> str:
    return cell


def laid_out(text: str, width: int = TABLE_WIDTH) -> str:
    return lay_out_tables(text, same, width)[0]


def test_columns_follow_the_delimiter_row_alignment() -> None:
    text = "| left | centre | right |\n|---|:-:|--:|\n| a | b | c |\n| long text | mid | 12345 |"
    assert laid_out(text) == "\n".join(
        [
            "```",
            "left       centre  right",
            "---------  ------  -----",
            "a            b         c",
            "long text   mid    12345",
            "```",
        ]
    )


def test_wide_characters_take_two_columns() -> None:
    assert display_width("界e\u0301😀") == 2 + 1 + 0 + 2
    text = "| word | n |\n|---|---|\n| 世界 | 1 |\n| ab | 2 |"
    assert laid_out(text).splitlines()[3:5] == ["世界  1", "ab    2"]


def test_rows_are_fitted_to_the_header() -> None:
    [table] = find_tables("a | b | c\n--|--|--\n1 | 2\n1 | 2 | 3 | 4\n| x \\| y | z |")
    assert table.header == ("a", "b", "c")
    assert table.aligns == ("left", "left", "left")
    assert table.rows == (("1", "2", ""), ("1", "2", "3"), ("x | y", "z", ""))


def test_a_table_ends_at_a_blank_line_or_a_line_without_a_pipe() -> None:
    text = "Intro line\n| a | b |\n|---|---|\n| 1 | 2 |\nAfter it.\n\n| c |\n| - |\n| 3 |\n\nEnd"
    first, second = find_tables(text)
    assert text[first.start : first.end] == "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert text[second.start : second.end] == "| c |\n| - |\n| 3 |\n"
    assert laid_out(text) == (
        "Intro line\n```\na  b\n-  -\n1  2\n```\nAfter it.\n\n```\nc\n-\n3\n```\n\nEnd"
    )


def test_spans_locate_each_laid_out_table() -> None:
    text = "x\n| a | b |\n|---|---|\n| 1 | 2 |\ny\n| c |\n|---|\n"
    out, spans = lay_out_tables(text, same)
    assert [out[a:b] for a, b in spans] == ["```\na  b\n-  -\n1  2\n```\n", "```\nc\n-\n```\n"]


def test_rule_rows_become_rules_and_are_skipped_by_row() -> None:
    text = "| item | cost |\n|---|--:|\n| tea | 2 |\n|---|---|\n| total | 2 |"
    assert laid_out(text).splitlines()[1:] == [
        "item   cost",
        "-----  ----",
        "tea       2",
        "-----  ----",
        "total     2",
        "```",
    ]
    assert laid_out(text, width=5) == "**item**: tea\n**cost**: 2\n\n**item**: total\n**cost**: 2"


def test_by_row_keeps_markup_and_skips_empty_cells_and_names() -> None:
    text = "| | **Name** | Note |\n|---|---|---|\n| 1 | `x` | |\n| 2 | y | z |"
    # No name: the value alone; a name already in bold is not bolded again.
    assert laid_out(text, width=10) == "1\n**Name**: `x`\n\n2\n**Name**: y\n**Note**: z"


def test_width_limit_is_on_the_widest_line() -> None:
    row = "| " + "x" * 28 + " | " + "y" * 30 + " |"
    text = f"| a | b |\n|---|---|\n{row}"
    assert laid_out(text, width=60).startswith("```\n")  # 28 + 2 + 30 = 60 columns
    assert laid_out(text, width=59).startswith("**a**: ")


def test_header_only_table() -> None:
    assert laid_out("| a | b |\n|---|---|") == "```\na  b\n-  -\n```"
    assert laid_out("| a | b |\n|---|---|", width=1) == "**a**\n**b**"


def test_cells_starting_with_backticks_get_a_longer_fence() -> None:
    assert laid_out("| code |\n|---|\n| ``` |") == "````\ncode\n----\n```\n````"


def test_by_row_lines_never_open_a_code_fence() -> None:
    # Written out by row, a cell reading ``` or ~~~ (or a column name with "*", kept as
    # typed) would be a fence line in prose: its marker is escaped, CommonMark-style.
    text = "| | *x* ``` |\n|---|---|\n| ``` | ~~~~ a |\n| ```py | `c` |"
    assert laid_out(text, width=5) == "\\`\\`\\`\n*x* ```: ~~~~ a\n\n\\`\\`\\`py\n*x* ```: `c`"
    assert laid_out("| ~~~ * | ``` |\n|---|---|", width=1) == "\\~\\~\\~ *\n**```**"
    # Not a fence line: left as is.
    assert laid_out("| | b |\n|---|---|\n| ```x``` | 1 |", width=1) == "```x```\n**b**: 1"
