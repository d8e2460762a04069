"""Sections of config.toml that are built only when the file has them or when first read.

Most runs use a few sections: a one-shot `parley chat -m` reads no role, MCP server,
budget or operator setting. A section declared as a `Section` costs nothing at load when
the file leaves it out: its model's module is not imported and its pydantic model not
built until the section is first read, and then it holds its defaults, as if the file had
an empty table (docs/benchmarks.md). A section the file has is validated at load like any
field, and a problem in it is reported at its key (`roles.ops.members`), with its fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from pydantic import ConfigDict, ValidationError
from pydantic_core import InitErrorDetails

SECTION_CONFIG = ConfigDict(extra="forbid", defer_build=True)
"""The pydantic config of config.toml's models: an unknown key is an error, and a model
is built when first used (`defer_build`). The whole file's model
(`bot.config.ParleyConfig`) holds every section's schema, so a section's model of its own
is made only if something validates it alone (docs/benchmarks.md)."""

T = TypeVar("T")


class Section(Generic[T]):
    """A configuration model's attribute holding one lazily built section.

    `load` imports the section's model and returns what validates its raw table (e.g.
    `RolesConfig.model_validate`); it may also raise a `ValueError` (a `FixableError`)
    for a check of its own, reported at the section's key. `default_env` are the `*_env`
    names the section's defaults give, so the secrets to redact are known without
    building it (`bot.wiring.secret_env_names`; a test compares them to the defaults).
    """

    __slots__ = ("_load", "default_env", "key")

    def __init__(
        self, load: Callable[[], Callable[[Any], T]], *, default_env: tuple[str, ...] = ()
    ) -> None:
        self._load = load
        self.default_env = default_env
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def validate(self, raw: object) -> T:
        """The section built from its raw table.

        Raises:
            ValidationError: located under this section's key.
        """
        try:
            return self._load()(raw)
        except ValidationError as exc:
            errors = [
                InitErrorDetails(
                    type=e["type"],
                    loc=(self.key, *e["loc"]),
                    input=e["input"],
                    ctx=e.get("ctx", {}),
                )
                for e in exc.errors(include_url=False)
            ]
        except ValueError as exc:
            errors = [
                InitErrorDetails(type="value_error", loc=(self.key,), input=raw, ctx={"error": exc})
            ]
        raise ValidationError.from_exception_data(self.key, errors)

    @overload
    def __get__(self, config: None, owner: type) -> Section[T]: ...

    @overload
    def __get__(self, config: object, owner: type) -> T: ...

    def __get__(self, config: object, owner: type) -> Section[T] | T:
        if config is None:
            return self
        built: dict[str, Any] = getattr(config, "_sections")  # noqa: B009 (a private attr)
        if self.key not in built:
            built[self.key] = self.validate({})  # the defaults
        value: T = built[self.key]
        return value


def sections_of(schema: type) -> dict[str, Section[Any]]:
    """The `Section`s of a configuration model and of its bases, by key."""
    found: dict[str, Section[Any]] = {}
    for klass in reversed(schema.__mro__):
        found.update({k: v for k, v in vars(klass).items() if isinstance(v, Section)})
    return found
