"""Fencing: a process speaks for a run only while it still holds it.

With several workers on one store, a worker silent for `worker_timeout_seconds` is taken
for dead and another one takes its runs over. A worker that was only stopped for a while
(SIGSTOP, a frozen VM, an overloaded machine) must then touch nothing of those runs when
it goes on: no post, edit or delete on a platform, no side-effecting tool call.

Each run in progress carries a `Fence` in its task's context (`entered`; tasks it starts
inherit it), and every adapter's edge to its platform asks it before each call (`admit`),
so previews, status lines, approval prompts and final answers are all covered wherever
they are sent from. Outside a run (a command's reply, a takeover's notice) no fence is
set and every call goes out.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Protocol

from core.errors import ChannelRefused


class RunFenced(ChannelRefused):
    """A platform call was not made: this process no longer holds the run it was for."""


class Fence(Protocol):
    """Whether this process still holds one run."""

    @property
    def lost(self) -> bool:
        """Known lost: another worker took the run over."""
        ...

    async def holds(self, wait: float = 0.0, *, unsure: bool = False) -> bool:
        """Whether this process may still act for the run now. Usually answered at once
        (a recent heartbeat proves nobody can have taken it over); otherwise after a
        heartbeat, waiting up to `wait` seconds for one to get through. False if the run
        is lost; `unsure` if it cannot be told (the store is out of reach)."""
        ...

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the run is found lost (at once if it is already)."""
        ...


class Held:
    """The fence of a process that shares its runs with nobody: it always holds them."""

    lost = False

    async def holds(self, wait: float = 0.0, *, unsure: bool = False) -> bool:
        return True

    def on_lost(self, callback: Callable[[], None]) -> None:
        pass


HELD = Held()

_current: ContextVar[Fence | None] = ContextVar("parley_fence", default=None)


@contextlib.contextmanager
def entered(fence: Fence) -> Iterator[None]:
    """Platform calls made inside (by this task, and by tasks it starts meanwhile) are for
    the run `fence` guards."""
    token = _current.set(fence)
    try:
        yield
    finally:
        _current.reset(token)


def enter(fence: Fence) -> None:
    """`entered` for the rest of the current task (a run's own task)."""
    _current.set(fence)


def current() -> Fence | None:
    """The fence of the run the current task acts for, if any."""
    return _current.get()


async def admit(call: Awaitable[object]) -> None:
    """Before a platform call: raise `RunFenced` (and drop `call` unawaited) if the run
    the current task acts for is no longer this process's."""
    fence = _current.get()
    if fence is None or await fence.holds():
        return
    if inspect.iscoroutine(call):
        call.close()
    raise RunFenced("not sent: another worker took over the run this was for")


__all__ = ["HELD", "Fence", "Held", "RunFenced", "admit", "current", "enter", "entered"]
