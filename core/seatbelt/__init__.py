"""The seatbelt: classification only. Pure functions from a command (or a call) to a
verdict with its reason — `ok`, `destructive` (asks an approver), `interactive` or
`blocked` — read with a real shell parser (tree-sitter's bash grammar): wrappers seen
through, options read as each program reads them, code Parley cannot read counted as
destructive (docs/guide/safety.md, "Seatbelts"). It does no I/O and knows nothing of
tools, the sandbox or the store; what it needs of the world (the tools' home) its caller
passes in. The wall that holds whatever it misses is `core.sandbox`.

Its API is `check_command`; the rules' modules are its own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.seatbelt.blocklist import check_command
    from core.seatbelt.verdicts import BlockVerdict, VerdictKind

__all__ = ["BlockVerdict", "VerdictKind", "check_command"]

# Loaded at first use, not with the package: the parser (tree-sitter) costs ~30 ms to import
# and a turn that runs no command never needs it.
_WHERE = {"check_command": "blocklist", "BlockVerdict": "verdicts", "VerdictKind": "verdicts"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
