"""What every streamed answer shares (docs/channels.md#answering): the paced background
loop that shows it as it grows, and the hook awaited before its first preview."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.clock import Clock

log = logging.getLogger(__name__)


async def before_first(hook: Callable[[], Awaitable[None]] | None, what: str) -> None:
    """Await a stream's `before_preview` hook, taken by the caller (it runs once, before
    the first preview, native stream or draft); a failure is logged and streaming goes on."""
    if hook is None:
        return
    try:
        await hook()
    except Exception:
        log.warning("preparing the first %s failed; streaming anyway", what, exc_info=True)


class Pacer:
    """The background loop of a streamed answer — a preview's edits, a native stream's
    appends, a draft's updates: each `wake()` asks for one more `flush`, run at most once
    per `min_interval` after `last_sent` and never two at a time, while `going()` holds.

    `stop()` lets a call already in flight land (cancelling it could lose track of a
    message that was in fact posted) and cancels the rest; `aclose()` cancels whatever
    runs. A flush is in flight as a whole unless it narrows `in_flight` itself."""

    def __init__(
        self,
        flush: Callable[[], Awaitable[None]],
        clock: Clock,
        min_interval: float,
        name: str,
        going: Callable[[], bool] = lambda: True,
    ) -> None:
        self._flush, self._clock, self._name, self._going = flush, clock, name, going
        self.min_interval = min_interval
        self.last_sent = float("-inf")
        self.in_flight = False
        self.closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    def sent(self) -> None:
        """A call went out just now: the next flush waits `min_interval` from here."""
        self.last_sent = self._clock.monotonic()

    async def wait_turn(self) -> None:
        """Sleep until `min_interval` has passed since the last call."""
        wait = self.last_sent + self.min_interval - self._clock.monotonic()
        if wait > 0:
            await self._clock.sleep(wait)

    async def _run(self) -> None:
        while not self.closed and self._going():
            await self._wake.wait()
            self._wake.clear()
            await self.wait_turn()
            if self.closed:
                return
            self.in_flight = True
            try:
                await self._flush()
            finally:
                self.in_flight = False

    async def stop(self) -> None:
        self.closed = True
        task = self._task
        if task is None or task.done():
            return
        if not self.in_flight:
            task.cancel()
        await asyncio.wait({task})
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s task failed", self._name, exc_info=exc)

    async def aclose(self) -> None:
        self.closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})


__all__ = ["Pacer", "before_first"]
