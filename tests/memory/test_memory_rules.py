"""The scope rule as a table (who sees what, where), and `[memory]`'s configuration errors."""

from __future__ import annotations

from typing import Any

import pytest

from bot.config import parse_config
from core.chat import Asker
from core.errors import ConfigError
from core.memory.scopes import ScopeNotAllowed, scope_for, visible_scopes, writable_scopes
from core.store import Scope

DM = Asker("slack", "D1", "U1", True, "slack:D1:")
CHANNEL = Asker("slack", "C1", "U1", False, "slack:C1:171.1")
CRON = Asker("cron", "nightly", "", False, "cron:nightly:")


def test_a_dm_sees_its_user_its_conversation_its_channel_and_the_team() -> None:
    assert visible_scopes(DM) == [
        Scope("conversation", "slack:D1:"),
        Scope("user", "slack:U1"),
        Scope("channel", "slack:D1"),
        Scope("team", "slack"),
    ]
    assert writable_scopes(DM) == visible_scopes(DM)


def test_a_channel_never_sees_a_user_scope_but_its_user_may_write_to_their_own() -> None:
    assert visible_scopes(CHANNEL) == [
        Scope("conversation", "slack:C1:171.1"),
        Scope("channel", "slack:C1"),
        Scope("team", "slack"),
    ]
    assert writable_scopes(CHANNEL)[-1] == Scope("user", "slack:U1")
    assert scope_for("user", CHANNEL) == Scope("user", "slack:U1")


def test_without_a_person_there_is_no_user_scope() -> None:
    assert [s.kind for s in visible_scopes(CRON)] == ["conversation", "channel", "team"]
    with pytest.raises(ScopeNotAllowed, match="no user scope here"):
        scope_for("user", CRON)


BASE: dict[str, Any] = {
    "default_provider": "p",
    "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
}


def test_memory_defaults_are_tools_on_and_auto_recall_off() -> None:
    memory = parse_config(BASE).memory
    assert (memory.enabled, memory.strategy, memory.auto_recall, memory.min_score) == (
        True,
        "lexical",
        0,
        0.0,
    )


@pytest.mark.parametrize(
    ("section", "key", "problem", "fix"),
    [
        (
            {"strategy": "semantic"},
            "memory.strategy",
            "`semantic` recall is not available",
            'set `strategy = "lexical"`',
        ),
        ({"auto_recall": -1}, "memory.auto_recall", "greater than or equal to 0", "got -1"),
        ({"auto_recall": 50}, "memory.auto_recall", "less than or equal to 20", "got 50"),
        ({"min_score": 1.5}, "memory.min_score", "less than 1", "got 1.5"),
        ({"recall": 3}, "memory.recall", "Extra inputs", "check its spelling"),
    ],
)
def test_a_bad_memory_value_names_the_key_and_the_fix(
    section: dict[str, Any], key: str, problem: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "memory": section})
    assert caught.value.key == key
    assert problem in caught.value.problem
    assert fix in caught.value.fix
