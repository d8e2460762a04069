"""What a check knows beyond the command itself, given by its caller: the seatbelt does no
I/O, so the tools' home directory is passed in (`check_command(command, home)`) and held
here for the length of one check; and the path helpers the rules need, as pure string
functions."""

from __future__ import annotations

from contextvars import ContextVar

HOME: ContextVar[str] = ContextVar("seatbelt_home", default="")
"""The tools' home directory during a check ("" when the caller gave none)."""


def basename(path: str) -> str:
    """The last component of a `/`-separated path (as `os.path.basename` on POSIX)."""
    return path[path.rfind("/") + 1 :]
