"""What every backend shares about queued writes: whose they are, so that a failed one is
raised by its owner's `flush` and not by another conversation's, and how many failed in
this process (the tests fail on any they did not cause)."""

from __future__ import annotations

import contextvars

from core import metrics

_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("store_writer", default=None)
_failed = 0


def write_for(owner: str) -> None:
    """Tag the current task's writes as `owner`'s (a conversation)."""
    _OWNER.set(owner)


def write_owner() -> str | None:
    """Whose writes the current task makes (None: nobody's in particular)."""
    return _OWNER.get()


def count_failed_write() -> None:
    """A backend reports one failed write (it has also logged it)."""
    global _failed
    _failed += 1
    metrics.store_failed_write()


def failed_writes() -> int:
    """Writes that failed so far, in every store of this process."""
    return _failed
