"""The `[triggers.NAME]` tables of config.toml: one signed webhook each (docs/triggers.md).

Everything a trigger's text can get wrong is found at load: the name, the source, the
`filter`/`close_on` expressions (`core.triggers.expr`) and the `prompt`/`message`/
`thread_by` templates (`core.triggers.template`), each reported as a `ConfigError` that
names its key (`triggers.ci.filter`). The secrets are not in the file: `secret_env` names
the variables, and `check_trigger_secrets` refuses an unset or unusable one by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final, TypeVar

from pydantic import AfterValidator, BaseModel, Field, PrivateAttr, field_validator, model_validator

from core.errors import ConfigError, FixableError
from core.sections import SECTION_CONFIG
from core.triggers.expr import Expr, compile_expr
from core.triggers.template import Template, compile_template
from core.triggers.verify import Source, check_secret

NAME_PATTERN: Final = re.compile(r"[a-z0-9_-]+")
DEFAULT_MAX_BODY_BYTES: Final = 1_048_576
T = TypeVar("T")


def _a_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise FixableError(
            f"trigger name `{name}` is not made of a-z, 0-9, `_` and `-` "
            "(it is the URL /hooks/NAME)",
            "rename the table, e.g. `[triggers.ci]`",
        )
    return name


TriggerName = Annotated[str, AfterValidator(_a_name)]


def _checked(compile_it: Any, text: str) -> None:
    """Compile `text` to see that it can be; a mistake becomes the key's FixableError."""
    try:
        compile_it(text)
    except ConfigError as exc:  # pydantic names the key from where this is raised
        raise FixableError(exc.problem, exc.fix) from exc


class TriggerConfig(BaseModel):
    """One `[triggers.NAME]` table: a webhook at `POST /hooks/NAME` that starts a run."""

    model_config = SECTION_CONFIG

    source: Source = Field(description="Whose signature scheme: github, gitlab, sentry, …")
    secret_env: str | list[str] = Field(
        description="The variable holding the signing secret; several (a list) while rotating."
    )
    events: list[str] = Field(
        default=[], description="Accepted event types; empty: every event. Others are ignored."
    )
    filter: str | None = Field(None, description="An expression a delivery must satisfy.")
    channel: str = Field(description="Where it posts: `<channel type>:<channel or chat id>`.")
    thread_by: str | None = Field(
        None, description="Template of the correlation key: one thread per rendered key."
    )
    prompt: str | None = Field(None, description="Template of what the run is asked.")
    deliver_only: bool = Field(False, description="Post the rendered `message`, no model call.")
    message: str | None = Field(None, description="Template posted when `deliver_only`.")
    allow_tools: list[str] = Field(default=[], description="Write/admin tools it may use.")
    provider: str | None = None
    rate_per_minute: int = Field(60, ge=1, le=100_000)
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1, le=64 * DEFAULT_MAX_BODY_BYTES)
    close_on: str | None = Field(
        None, description="An expression: a delivery that satisfies it ends the correlation."
    )
    dedupe_hours: float = Field(
        72.0,
        gt=0,
        le=24 * 90,
        description="How long a delivery id is remembered: a redelivery within it is a duplicate.",
    )

    _compiled: dict[str, Any] = PrivateAttr(default_factory=dict)  # by key: Expr or Template

    @field_validator("secret_env")
    @classmethod
    def _variable_names(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names or not all(n.strip() for n in names):
            raise FixableError(
                "names no variable", 'name the secret\'s variable, e.g. "GITHUB_WEBHOOK_SECRET"'
            )
        return value

    @field_validator("channel")
    @classmethod
    def _a_target(cls, channel: str) -> str:
        kind, _, ident = channel.partition(":")
        if not kind.strip() or not ident.strip():
            raise FixableError(
                f"`{channel}` is not a delivery target",
                'write `<channel type>:<channel or chat id>`, e.g. "slack:C0123456789"',
            )
        return channel

    @field_validator("filter", "close_on")
    @classmethod
    def _an_expression(cls, text: str | None) -> str | None:
        if text is not None:
            _checked(compile_expr, text)
        return text

    @field_validator("thread_by", "prompt", "message")
    @classmethod
    def _a_template(cls, text: str | None) -> str | None:
        if text is not None:
            _checked(compile_template, text)
        return text

    @model_validator(mode="after")
    def _what_it_posts(self) -> TriggerConfig:
        if self.deliver_only and self.message is None:
            raise FixableError(
                "deliver_only = true posts the `message` template, and there is none",
                'add `message = "…"`, or set deliver_only = false and give a `prompt`',
            )
        if not self.deliver_only and self.prompt is None:
            raise FixableError(
                "a trigger that runs the model needs a `prompt`",
                'add `prompt = "…"` (or deliver_only = true with a `message`)',
            )
        return self

    def secret_vars(self) -> list[str]:
        """The variables of the secrets, the first one the current."""
        return [self.secret_env] if isinstance(self.secret_env, str) else list(self.secret_env)

    def secrets(self, environ: Mapping[str, str]) -> list[str]:
        """The secrets set in `environ`, in `secret_env`'s order (unset ones left out)."""
        return [s for v in self.secret_vars() if (s := environ.get(v, ""))]

    def expr(self, key: str) -> Expr | None:
        """`filter` or `close_on`, compiled once (checked already, so this cannot fail)."""
        return self._compile(key, compile_expr)

    def template(self, key: str) -> Template | None:
        """`prompt`, `message` or `thread_by`, compiled once."""
        return self._compile(key, compile_template)

    def _compile(self, key: str, compile_it: Callable[..., T]) -> T | None:
        text = getattr(self, key)
        if text is None:
            return None
        if key not in self._compiled:
            self._compiled[key] = compile_it(text, key=key)
        found: T = self._compiled[key]
        return found


def check_trigger_secrets(
    triggers: Mapping[str, TriggerConfig], environ: Mapping[str, str]
) -> None:
    """Refuse a trigger whose secret variable is unset, empty or unusable for its source.

    Raises:
        ConfigError: naming the trigger (`triggers.NAME.secret_env`) and the variable.
    """
    for name, trigger in triggers.items():
        for variable in trigger.secret_vars():
            problem = check_secret(trigger.source, environ.get(variable, ""))
            if problem == "is empty":
                problem = "is not set" if variable not in environ else "is empty"
            if problem is not None:
                raise ConfigError(
                    f"triggers.{name}.secret_env",
                    f"trigger `{name}`: the variable `{variable}` {problem}",
                    f"export {variable}=… with the secret the sender signs with "
                    "(docs/triggers.md#configuration)",
                )


__all__ = ["NAME_PATTERN", "TriggerConfig", "TriggerName", "check_trigger_secrets"]
