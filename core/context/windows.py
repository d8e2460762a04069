"""Context windows per model (docs/context.md): explicit config → shipped catalog → 8192.

The catalog is `core/models.toml` (package data), read once with `importlib.resources`.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from core.records import record

FALLBACK_WINDOW = 8192


@record(frozen=True, slots=True)
class Catalog:
    """The three match tables; prefixes are kept longest first so the first hit wins."""

    exact: dict[str, int]
    prefix: tuple[tuple[str, int], ...]
    substring: tuple[tuple[str, int], ...]

    def lookup(self, model: str) -> int | None:
        """The window for `model`, or `None` if no entry matches."""
        name = model.strip().lower()
        # "openai/gpt-4o" and "ollama/llama3.1:8b": also try the bare model name.
        names = (name, name.rsplit("/", 1)[-1]) if "/" in name else (name,)
        for candidate in names:
            if candidate in self.exact:
                return self.exact[candidate]
        for candidate in names:
            for key, window in self.prefix:
                if candidate.startswith(key):
                    return window
        for key, window in self.substring:
            if key in name:
                return window
        return None


def _table(data: dict[str, object], section: str) -> dict[str, int]:
    raw = data.get(section, {})
    if not isinstance(raw, dict):
        raise ValueError(f"models.toml: [{section}] must be a table")
    out: dict[str, int] = {}
    for key, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"models.toml: [{section}] {key!r} must be a positive integer")
        out[str(key).lower()] = value
    return out


def _longest_first(table: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(table.items(), key=lambda kv: (-len(kv[0]), kv[0])))


@functools.cache
def catalog() -> Catalog:
    """The shipped catalog, parsed on first use and cached."""
    text = resources.files("core").joinpath("models.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return Catalog(
        exact=_table(data, "exact"),
        prefix=_longest_first(_table(data, "prefix")),
        substring=_longest_first(_table(data, "substring")),
    )


def context_window(model: str, explicit: int | None = None) -> int:
    """The context window of `model`: `explicit` if given, else the catalog, else 8192."""
    if explicit is not None and explicit > 0:
        return explicit
    found = catalog().lookup(model)
    return FALLBACK_WINDOW if found is None else found
