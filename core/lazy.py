"""Names a package imports from its modules on first use (PEP 562), so that a process that
needs one light name does not load the heavy modules behind the others (`parley chat -m`
loads no store and no durable agent; docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: `name` comes from `package.homes[name]`, once
    (it is then kept in the package's namespace)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__all__ = ["lazy_names"]
