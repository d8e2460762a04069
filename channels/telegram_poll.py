"""Telegram long polling (docs/channels.md#stored-before-acknowledged): an update is
confirmed only once it is taken in, and polling never stops while the channel runs.

The offset sent to `getUpdates` confirms every update below it, so it stays at the first
update still being taken in. PTB's `Updater` confirms each batch as soon as it has fetched
it, so polling is driven here instead.

Poison updates: PTB parses a `getUpdates` batch as a whole, so one update it cannot read
would fail every poll and hold the offset for good. The batch is fetched unparsed and each
update read on its own (`telegram_updates.read_update`); one that cannot be taken in is set
aside by the adapter (one warning line, its JSON recorded for the operator) and confirmed
once that record is committed. A poll that fails anyway — a bug, an answer nothing
foresaw — is started again after a growing wait on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from telegram import Bot, Update

from channels.retry import call_with_retry
from channels.telegram_api import telegram_call
from channels.telegram_updates import read_update, update_id_of
from core.clock import Clock
from core.errors import ChannelError, ChannelRefused, ChannelUnavailable

log = logging.getLogger(__name__)

ALLOWED_UPDATES = ("message", "callback_query")
POLL_TIMEOUT = timedelta(seconds=10)  # long poll
HANDOVER_WAIT = 1.0  # seconds to wait for unfinished hand-overs before polling again
POLL_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # waits while getUpdates fails; 30 s repeats
READ_MARGIN = 5.0  # seconds a poll's answer may take beyond its long-poll timeout
HEALTHY_POLL = 60.0  # seconds a restarted poll must run before its restart waits start over

Dispatch = Callable[[Update], Awaitable["asyncio.Future[None]"]]
"""Hands an update to the handlers; the future is done once it is taken in."""
SetAside = Callable[[int | None, object, str], Awaitable[Exception | None]]
"""Records an update that cannot be taken in (its id, JSON, the problem); why that failed."""


class Poller:
    """The long poll of one bot: `run` until cancelled, then `settle`."""

    def __init__(self, bot: Bot, clock: Clock, dispatch: Dispatch, set_aside: SetAside) -> None:
        self.bot, self.clock = bot, clock
        self._dispatch, self._set_aside = dispatch, set_aside
        self.offset = 0  # every update below it is taken in
        self._handovers: dict[int, asyncio.Future[None]] = {}  # polled, at or past the offset

    async def run(self) -> None:
        """Poll, started again whenever it fails, after `POLL_BACKOFF` waits on the clock
        (they start over once a poll ran `HEALTHY_POLL` seconds). A leased poll keeps its
        lease meanwhile: another worker's poll would fail the same way."""
        failures = 0
        while True:
            started = self.clock.monotonic()
            try:
                await self._poll()
            except Exception as exc:
                if self.clock.monotonic() - started >= HEALTHY_POLL:
                    failures = 0
                failures += 1
                wait = POLL_BACKOFF[min(failures, len(POLL_BACKOFF)) - 1]
                log.error(
                    "telegram: polling failed (%s); starting it again in %.0f s",
                    type(exc).__name__,
                    wait,
                    exc_info=exc,
                )
                await self.clock.sleep(wait)

    async def settle(self) -> None:
        """After `run` was cancelled and the hand-overs ended: move the offset past what
        was taken in and tell Telegram, so a restart does not fetch it again (it would be
        dropped as a redelivery anyway)."""
        self._advance()
        if not self.offset:
            return
        with contextlib.suppress(ChannelError):
            await telegram_call(self._get_updates(timedelta(0)))

    async def _poll(self) -> None:
        """Until an update is taken in, polls return at once (with it again: skipped) after
        waiting up to `HANDOVER_WAIT` for it, so a slow hand-over in one chat holds back
        the confirmation, not the other chats."""
        handovers = self._handovers
        while True:
            batch = await call_with_retry(
                self._fetch,
                clock=self.clock,
                attempts=None,  # polling goes on until stopped, however long Telegram is away
                backoff=POLL_BACKOFF,
                rate_limits=None,
                what="telegram getUpdates",
            )
            for raw in batch:
                update_id = update_id_of(raw)
                if update_id is not None and update_id in handovers:
                    continue  # fetched again while the offset waits for an earlier one
                update = read_update(raw, self.bot)
                if isinstance(update, Update):
                    handovers[update.update_id] = await self._dispatch(update)
                    continue
                failed = await self._set_aside(update_id, raw, update)
                if update_id is not None:  # confirmed once recorded, like a stored message
                    handovers[update_id] = _settled(failed)
            unfinished = [h for h in handovers.values() if not h.done()]
            if unfinished:
                await asyncio.wait(unfinished, timeout=HANDOVER_WAIT)
            if not self._advance():
                await self.clock.sleep(HANDOVER_WAIT)  # a failed hand-over: retry it calmly

    async def _fetch(self) -> list[object]:
        """One `getUpdates` from the offset, each update's JSON unparsed. A refusal counts
        as an outage here: Telegram answers 409 while a webhook or another poller holds
        the updates, which passes."""
        timeout = timedelta(0) if self._handovers else POLL_TIMEOUT
        try:
            batch = await telegram_call(self._get_updates(timeout))
        except ChannelRefused as exc:
            raise ChannelUnavailable(str(exc)) from exc
        if not isinstance(batch, list):
            raise ChannelUnavailable("telegram: getUpdates answered no list of updates")
        return batch

    def _get_updates(self, timeout: timedelta) -> Awaitable[Any]:
        """`getUpdates` from the offset, its answer left as JSON. PTB's `get_updates`
        parses the batch as one and raises for all of it if one update does not parse;
        `_post` is the request it makes (on the same connection pool) without the parsing.
        The poison-update tests fail loudly should a PTB release rename it."""
        return self.bot._post(
            "getUpdates",
            {"offset": self.offset, "timeout": timeout, "allowed_updates": list(ALLOWED_UPDATES)},
            read_timeout=timeout.total_seconds() + READ_MARGIN,
        )

    def _advance(self) -> bool:
        """Move the offset past the updates taken in, up to the first that is not; False
        if one failed (it is forgotten here, so the next poll takes it in again)."""
        handovers = self._handovers
        for update_id in sorted(handovers):
            handover = handovers[update_id]
            if not handover.done():
                return True
            del handovers[update_id]
            if handover.cancelled() or handover.exception() is not None:
                return False
            self.offset = max(self.offset, update_id + 1)
        return True


def _settled(failure: Exception | None) -> asyncio.Future[None]:
    """A hand-over that is already over: done, or failed with `failure`."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if failure is None:
        future.set_result(None)
    else:
        future.set_exception(failure)
    return future
