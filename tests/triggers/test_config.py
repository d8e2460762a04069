"""The `[triggers.NAME]` model: defaults, and each mistake named by its key."""

from __future__ import annotations

from typing import Any

import pytest

from core.config import CoreConfig, parse_config
from core.errors import ConfigError
from core.triggers.config import TriggerConfig, check_trigger_secrets

CI = {
    "source": "github",
    "secret_env": "GITHUB_WEBHOOK_SECRET",
    "events": ["check_run"],
    "filter": "action == 'completed' and check_run.conclusion == 'failure'",
    "channel": "slack:C0123456789",
    "thread_by": "{repository.full_name}#{check_run.head_sha}",
    "prompt": "CI failed on {repository.full_name}: {check_run.name}.",
}


def _load(**trigger: Any) -> CoreConfig:
    raw = {
        "default_provider": "openai",
        "providers": {"openai": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
        "triggers": {trigger.pop("_name", "ci"): {**CI, **trigger}},
    }
    return parse_config(raw, CoreConfig)


def _refused(**trigger: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        _load(**trigger)
    return caught.value


def test_a_trigger_loads_with_the_issues_defaults() -> None:
    trigger = _load().triggers["ci"]
    assert (trigger.rate_per_minute, trigger.max_body_bytes) == (60, 1048576)
    assert (trigger.deliver_only, trigger.allow_tools, trigger.close_on) == (False, [], None)
    assert trigger.secret_vars() == ["GITHUB_WEBHOOK_SECRET"]
    payload = {"action": "completed", "check_run": {"conclusion": "failure", "head_sha": "ab"}}
    expr = trigger.expr("filter")
    assert expr is not None
    assert expr.matches(payload)
    thread = trigger.template("thread_by")
    assert thread is not None
    assert thread.render(payload).text == "#ab"


def test_no_triggers_is_an_empty_table() -> None:
    raw = {
        "default_provider": "openai",
        "providers": {"openai": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
    }
    assert parse_config(raw, CoreConfig).triggers == {}


@pytest.mark.parametrize(
    ("change", "key", "says"),
    [
        ({"_name": "CI Failures"}, "triggers.CI Failures", "a-z, 0-9"),
        ({"source": "jenkins"}, "triggers.ci.source", "github"),
        ({"filter": "__import__('os')"}, "triggers.ci.filter", "character"),
        ({"close_on": "action ==="}, "triggers.ci.close_on", "character"),
        ({"thread_by": "{repository.full_name"}, "triggers.ci.thread_by", "never closed"),
        ({"prompt": "{a + b}"}, "triggers.ci.prompt", "character"),
        ({"channel": "C0123"}, "triggers.ci.channel", "not a delivery target"),
        ({"secret_env": []}, "triggers.ci.secret_env", "names no variable"),
        ({"provider": "nope"}, "triggers.ci.provider", "not a configured provider"),
        ({"rate_per_minute": 0}, "triggers.ci.rate_per_minute", ""),
        ({"max_body_bytes": -1}, "triggers.ci.max_body_bytes", ""),
        ({"secret": "hunter2"}, "triggers.ci.secret", "xtra"),
        ({"deliver_only": True}, "triggers.ci", "message"),
        ({"prompt": None}, "triggers.ci", "needs a `prompt`"),
    ],
)
def test_each_mistake_names_its_key(change: dict[str, Any], key: str, says: str) -> None:
    error = _refused(**change)
    # a cross-key check (the provider) is reported at the top level, naming the key itself
    assert error.key.startswith(key) or key in error.problem, error
    assert says in error.problem, error.problem


def test_deliver_only_with_a_message_needs_no_prompt() -> None:
    trigger = TriggerConfig.model_validate(
        {**CI, "prompt": None, "deliver_only": True, "message": "{check_run.name} failed"}
    )
    message = trigger.template("message")
    assert message is not None
    assert trigger.template("prompt") is None
    assert message.render({"check_run": {"name": "lint"}}).text == "lint failed"


def test_a_list_of_secret_variables_is_for_rotation() -> None:
    trigger = TriggerConfig.model_validate({**CI, "secret_env": ["NEW_SECRET", "OLD_SECRET"]})
    assert trigger.secret_vars() == ["NEW_SECRET", "OLD_SECRET"]
    assert trigger.secrets({"OLD_SECRET": "o", "NEW_SECRET": "n"}) == ["n", "o"]


@pytest.mark.parametrize(
    ("source", "environ", "says"),
    [
        ("github", {}, "`GITHUB_WEBHOOK_SECRET` is not set"),
        ("github", {"GITHUB_WEBHOOK_SECRET": ""}, "`GITHUB_WEBHOOK_SECRET` is empty"),
        ("standard", {"GITHUB_WEBHOOK_SECRET": "whsec_!!"}, "not a Standard Webhooks secret"),
    ],
)
def test_an_unusable_secret_variable_is_refused_by_name(
    source: str, environ: dict[str, str], says: str
) -> None:
    triggers = {"ci": TriggerConfig.model_validate({**CI, "source": source})}
    with pytest.raises(ConfigError) as caught:
        check_trigger_secrets(triggers, environ)
    assert caught.value.key == "triggers.ci.secret_env"
    assert says in caught.value.problem
    assert "trigger `ci`" in caught.value.problem


def test_every_rotation_variable_must_be_set() -> None:
    trigger = TriggerConfig.model_validate({**CI, "secret_env": ["A_SECRET", "B_SECRET"]})
    check_trigger_secrets({"ci": trigger}, {"A_SECRET": "a", "B_SECRET": "b"})
    with pytest.raises(ConfigError, match="`B_SECRET` is not set"):
        check_trigger_secrets({"ci": trigger}, {"A_SECRET": "a"})
