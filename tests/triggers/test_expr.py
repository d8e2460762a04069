"""The `filter` / `close_on` expression language: what it answers and what it refuses."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from core.triggers.expr import MAX_LENGTH, MAX_NODES, compile_expr, parse_path

ISSUE_FILTER = "action in ['completed'] and check_run.conclusion == 'failure'"

# the shape of GitHub's `check_run` webhook (docs: "Webhook events and payloads"), trimmed
CHECK_RUN: dict[str, Any] = {
    "action": "completed",
    "check_run": {
        "id": 128620228,
        "name": "Octocoders-linter",
        "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
        "status": "completed",
        "conclusion": "failure",
        "started_at": "2019-05-15T15:21:12Z",
        "output": {"title": "Lint", "summary": "2 errors", "annotations_count": 2},
        "check_suite": {"id": 118578147, "head_branch": "changes"},
        "pull_requests": [{"number": 2, "head": {"ref": "changes"}, "base": {"ref": "master"}}],
    },
    "repository": {"id": 186853002, "full_name": "Codertocat/Hello-World", "private": False},
    "sender": {"login": "Codertocat", "type": "User"},
}


def payload(**changes: Any) -> dict[str, Any]:
    """CHECK_RUN with `check_run` keys (or `action`) changed."""
    body = copy.deepcopy(CHECK_RUN)
    if "action" in changes:
        body["action"] = changes.pop("action")
    body["check_run"].update(changes)
    return body


# -- the issue's example ---------------------------------------------------------------


def test_the_issues_filter_matches_a_failed_check_run() -> None:
    assert compile_expr(ISSUE_FILTER).matches(CHECK_RUN)


@pytest.mark.parametrize(
    "body",
    [
        payload(conclusion="success"),
        payload(action="created", status="queued", conclusion=None),
        payload(action="rerequested"),
        {"zen": "Keep it logically awesome.", "hook_id": 1},  # GitHub's ping
        {},
    ],
    ids=["succeeded", "created", "rerequested", "ping", "empty"],
)
def test_the_issues_filter_does_not_match_other_check_runs(body: dict[str, Any]) -> None:
    assert not compile_expr(ISSUE_FILTER).matches(body)


# -- what the language can say ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("check_run.pull_requests[0].number == 2", True),
        ("check_run.pull_requests[-1].base.ref == 'master'", True),
        ("check_run['check_suite']['head_branch'] == 'changes'", True),
        ("check_run.output.annotations_count > 1", True),
        ("1 <= check_run.output.annotations_count < 2", False),
        ("not repository.private", True),
        ("repository.private == false and sender.type != null", True),
        ("repository.private == False or x", True),
        ("'Coder' in sender.login", True),
        ("sender.login not in ('dependabot[bot]', 'renovate[bot]')", True),
        ("check_run.conclusion in [repository.full_name, 'failure']", True),
        ("'head_branch' in check_run.check_suite", True),
        ("check_run.pull_requests", True),
        ("check_run.id > -1 and check_run.id == 128620228", True),
        ("check_run.started_at >= '2019-01-01'", True),
        ("(((action == 'completed')))", True),
    ],
)
def test_an_expression_answers_from_the_payload(text: str, expected: bool) -> None:
    assert compile_expr(text).matches(CHECK_RUN) is expected


def test_and_and_or_give_the_deciding_value_like_python() -> None:
    assert compile_expr("check_run.nothing or sender.login").value(CHECK_RUN) == "Codertocat"
    assert compile_expr("action and check_run.nothing").value(CHECK_RUN) is None


def test_a_literal_list_is_a_value() -> None:
    assert compile_expr("[1, 'a', None, -2.5]").value({}) == [1, "a", None, -2.5]


@pytest.mark.parametrize(
    "text",
    [
        "check_run.nothing == None",
        "nothing.at.all == None",
        "check_run.pull_requests[5] == None",
        "check_run.pull_requests[-9] == None",
        "check_run.pull_requests['number'] == None",  # a key asked of a list
        "check_run[0] == None",  # an index asked of an object
        "action.length == None",  # a key asked of a string
        "check_run.id.x[0]['y'] == None",
    ],
)
def test_a_missing_path_is_none_not_an_error(text: str) -> None:
    assert compile_expr(text).matches(CHECK_RUN)


@pytest.mark.parametrize(
    "text",
    [
        "'a' < 1",
        "action > 3",
        "check_run <= check_run.pull_requests",
        "nothing < 1",
        "nothing >= nothing",
        "1 in action",
        "'a' in 5",
        "'a' in nothing",
        "check_run in check_run",  # an unhashable key looked up in an object
        "check_run.pull_requests in check_run",
    ],
)
def test_a_type_mismatch_is_false_not_an_error(text: str) -> None:
    assert compile_expr(text).matches(CHECK_RUN) is False


def test_not_in_against_a_non_container_is_true() -> None:
    assert compile_expr("'a' not in nothing").matches(CHECK_RUN)


def test_json_spellings_are_literals_not_payload_keys() -> None:
    trap = {"true": False, "false": True, "null": 1, "flag": False}
    assert compile_expr("flag == false").matches(trap)
    assert compile_expr("true and not false and null == None").matches(trap)


def test_a_payload_key_beginning_with_dunder_is_reached_by_subscript() -> None:
    assert compile_expr("node['__typename'] == 'Issue'").matches({"node": {"__typename": "Issue"}})


def test_an_expression_may_span_lines() -> None:
    text = "action == 'completed'\n  and check_run.conclusion == 'failure'\n"
    assert compile_expr(text).matches(CHECK_RUN)


def test_parse_path_gives_the_steps() -> None:
    assert parse_path(" issues[0].user['login'] ") == ("issues", 0, "user", "login")


# -- what it refuses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "what", "position"),
    [
        ("__import__('os')", "a function call", 1),
        ("().__class__", "the name `__class__`", 4),
        ("action.__class__.__mro__", "the name `__mro__`", 18),
        ("__builtins__", "the name `__builtins__`", 1),
        ("open('x')", "a function call", 1),
        ("action.upper() == 'X'", "a function call", 1),
        ("[x for x in y]", "a comprehension", 1),
        ("any(x for x in y)", "a function call", 1),
        ("a**b", "arithmetic", 1),
        ("9**9**9 > 1", "arithmetic", 1),
        ("'a' * 10**9", "arithmetic", 1),
        ("x == 1 + 1", "arithmetic", 6),
        ("lambda: 1", "a lambda", 1),
        ("f'{x}' == 'a'", "an f-string", 1),
        ("(y := 1)", "an assignment (:=)", 2),
        ("a if b else c", "a conditional expression", 1),
        ("{'a': 1}", "a dict literal", 1),
        ("{1, 2}", "a set literal", 1),
        ("a is None", "`is`", 1),
        ("a is not None", "`is not`", 1),
        ("x[1:2]", "a subscript must be a number or a quoted key", 3),
        ("x[y]", "a subscript must be a number or a quoted key", 3),
        ("x[True]", "a subscript must be a number or a quoted key", 3),
        ("-x < 0", "this operator", 1),
        ("~1", "this operator", 1),
        ("b'x' == x", "the literal b'x'", 1),
        ("x == 1j", "the literal 1j", 6),
        ("...", "the literal Ellipsis", 1),
        ("x ===", "not valid syntax", 5),
        ("", "an empty expression", 1),
        ("   \n ", "an empty expression", 1),
        ("x == 1; import os", "not valid syntax", 7),
        ("a\x00", "not valid syntax", 1),
        ("'é' == x.__y", "the name `__y`", 10),  # characters, not UTF-8 bytes
    ],
)
def test_a_construct_outside_the_language_is_a_config_error(
    text: str, what: str, position: int
) -> None:
    with pytest.raises(ConfigError) as caught:
        compile_expr(text, key="triggers.ci.filter")
    assert caught.value.key == "triggers.ci.filter"
    assert caught.value.problem.startswith(what)
    assert f"at character {position} of `{text.strip()}`" in caught.value.problem
    assert "comparisons" in caught.value.fix


def test_an_expression_over_the_length_cap_is_refused() -> None:
    text = "action == '" + "x" * MAX_LENGTH + "'"
    with pytest.raises(ConfigError, match=f"longer than {MAX_LENGTH} characters"):
        compile_expr(text)


def test_an_expression_over_the_node_cap_is_refused() -> None:
    text = " or ".join(["a"] * (MAX_NODES // 2))  # two nodes a name: Name and Load
    assert len(text) < MAX_LENGTH
    with pytest.raises(ConfigError, match=f"more than {MAX_NODES} parts"):
        compile_expr(text)


def test_deep_nesting_is_refused_cleanly() -> None:
    with pytest.raises(ConfigError):
        compile_expr("not " * 240 + "x")
    with pytest.raises(ConfigError):
        compile_expr("[" * 300 + "]" * 300)


# -- properties ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=10,
)
PROBES = [
    ISSUE_FILTER,
    "a < b",
    "a.b[0] >= 'x' or not a[1]",
    "a in b and b not in a",
    "a == [a, b] or a in [1, 'x', None]",
    "a.x.y != b['k'][-1]",
]


@given(st.text(max_size=60))
def test_any_text_compiles_or_is_a_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        compile_expr(text)


@given(a=json_values, b=json_values)
def test_evaluation_never_raises(a: object, b: object) -> None:
    for probe in PROBES:
        compile_expr(probe).matches({"a": a, "b": b})


@given(a=json_values, b=json_values, c=json_values)
def test_in_a_literal_list_is_equality_with_one_of_its_items(
    a: object, b: object, c: object
) -> None:
    body = {"a": a, "b": b, "c": c}
    listed = compile_expr("a in [b, c]").matches(body)
    assert listed == compile_expr("a == b or a == c").matches(body)
    assert compile_expr("a not in [b, c]").matches(body) is not listed
