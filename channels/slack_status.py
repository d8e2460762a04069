"""What the bot is doing, shown under a Slack thread: `assistant.threads.setStatus`
(docs/channels.md#slack-status).

Slack shows the status ("Parley is thinking…") in the thread until the app replies, and
drops it by itself after about two minutes: a status that must stay is sent again every
`refresh` seconds (90 by default). One `ThreadStatus` per thread, shared by the thread's
responders, so a run's stream, its typing and its approval prompts show one status and
never race each other's calls: one task sends, in order, what was asked last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.clock import Clock
from core.errors import ChannelError, ChannelRefused

log = logging.getLogger(__name__)

THINKING = "is thinking…"
APPROVAL = "is waiting for approval"
REFRESH_SECONDS = 90.0  # Slack clears a status after about 2 minutes without a reply


def running(tool: str) -> str:
    return f"is running `{tool}`…"


class ThreadStatus:
    """The status of one thread. `show` and `clear` return at once; the one background
    task sends the latest wish (and re-sends a status that stays, every `refresh` s).

    A refusal (the thread is not one Slack shows statuses in, a missing scope) turns the
    status off for this thread: it is a courtesy, never a reason to fail a run."""

    def __init__(
        self,
        send: Callable[[str], Awaitable[object]],
        clock: Clock,
        *,
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        self._send, self._clock, self._refresh = send, clock, refresh
        self._wanted = ""
        self._shown = ""  # what Slack was last told
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._synced.set()
        self._task: asyncio.Task[None] | None = None
        self.off = False

    @property
    def status(self) -> str:
        return self._wanted

    def show(self, status: str) -> None:
        """Show `status` ("" clears it)."""
        if self.off or status == self._wanted:
            return
        self._wanted = status
        self._synced.clear()
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="slack status")

    async def clear(self) -> None:
        """Clear the status and wait until Slack was told (or it failed)."""
        self.show("")
        await self.synced()

    async def synced(self) -> None:
        """Wait until Slack was told the latest status (or telling it failed)."""
        if self._task is not None and not self._task.done():
            await self._synced.wait()

    async def close(self) -> None:
        """Stop re-sending; what is shown stays (Slack drops it by itself)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        while not self.off:
            self._changed.clear()
            status = self._wanted
            if status or self._shown:  # nothing to clear if nothing was shown
                await self._tell(status)
            if self._wanted != status:
                continue  # changed while it was being sent
            self._synced.set()
            if not status:
                return
            sleep = asyncio.ensure_future(self._clock.sleep(self._refresh))
            change = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({sleep, change}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleep.cancel()
                change.cancel()
        self._synced.set()

    async def _tell(self, status: str) -> None:
        try:
            await self._send(status)
            self._shown = status
        except ChannelRefused as exc:
            log.info("slack: no thread status here (%s); not showing it", exc.code or exc)
            self.off = True
        except ChannelError as exc:
            log.debug("slack: setting the thread status failed: %s", exc)
