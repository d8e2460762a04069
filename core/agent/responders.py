"""Responders the agent itself uses (the channels have their own)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from core.chat import ApprovalRequest, Responder
from core.errors import DeliveryFailed
from core.events import LoopEvent

log = logging.getLogger(__name__)


class QuietResponder:
    """A responder for runs nobody watches (cron jobs, `Agent.run` without one): it posts
    nothing, and asks nobody (such runs' policy has no "ask" verdict, or they fail)."""

    async def send(self, text: str) -> None:
        log.info("notice of an unwatched run (not posted): %s", text)

    def stream(self) -> QuietResponder:
        return self

    def __call__(self, event: LoopEvent) -> None:
        pass

    async def finish(self, text: str) -> None:
        pass

    async def approve(self, request: ApprovalRequest) -> bool:
        return False

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        yield


async def safe_send(responder: Responder, text: str) -> bool:
    try:
        await responder.send(text)
    except DeliveryFailed:
        log.warning("could not post to the conversation", exc_info=True)
        return False
    return True


__all__ = ["QuietResponder", "safe_send"]
