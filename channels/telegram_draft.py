"""Streaming a private-chat answer as a Telegram draft (docs/channels.md#telegram-drafts).

`sendMessageDraft` shows a growing draft under the chat (Bot API 9.3+): nothing is posted
until the answer is done, and then it is sent as messages (split as usual). An empty draft
shows Telegram's "Thinking…" placeholder while the model works; a tool step or a
compaction shows as one status line under the text. Drafts are ephemeral (Telegram drops
one after about 30 s without an update), so a crash leaves nothing to clean up.

Draft updates stay within `min_interval` per answer and a `budget` shared by the channel's
chats. Where Telegram refuses drafts (a group, an old Bot API, a bot without the feature)
the answer goes on by edits (`channels.stream.ReplyStreamer`), from the text it has so far.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

from telegram import Bot

from channels.pacing import Pacer, before_first
from channels.status import status_line
from channels.stream import EditBudget, ReplyStreamer, deliver
from channels.telegram_api import telegram_call
from core.chat import may_become_silent
from core.clock import Clock
from core.errors import ChannelError, ChannelRateLimited, ChannelRefused
from core.events import (
    CompactionProgress,
    LLMCallStarted,
    LoopEvent,
    Notice,
    StreamRestarted,
    TextDelta,
    ToolFinished,
    ToolStarted,
)
from core.secrets import scrub

log = logging.getLogger(__name__)

DRAFT_LIMIT = 4096  # characters of a draft's text
_draft_ids = itertools.count(1)


def _with_status(text: str, status: str, limit: int) -> str:
    tail = f"\n\n{status}" if status and text else status
    room = limit - len(tail)
    if len(text) > room:
        text = "…" + text[-(room - 1) :]  # the end of a long answer is what grows
    return text + tail


class DraftStream:
    """A `core.chat.PreviewStream` that streams into a draft and sends the final text."""

    def __init__(
        self,
        bot: Bot,
        chat_id: int,
        thread_id: int | None,
        edits: ReplyStreamer,
        *,
        clock: Clock,
        min_interval: float,
        budget: EditBudget | None = None,
        unsupported: Callable[[], None] | None = None,
    ) -> None:
        self._bot, self._chat_id, self._thread_id = bot, chat_id, thread_id
        self._edits, self._surface = edits, edits.surface
        self._clock, self._budget = clock, budget
        self._unsupported = unsupported
        self._draft_id = next(_draft_ids)
        self._text = ""
        self._segment = 0
        self._status = ""
        self._shown: str | None = None  # the draft as last sent
        self._drafting = True
        self._ids: list[str] = []
        self._pacer = Pacer(self._flush, clock, min_interval, "draft", going=lambda: self._drafting)
        self.on_posted: Callable[[str], None] | None = None
        self.before_preview: Callable[[], Awaitable[None]] | None = None

    @property
    def message_ids(self) -> list[str]:
        return self._edits.message_ids if not self._drafting else list(self._ids)

    async def retract(self, message_ids: list[str], note: str) -> None:
        await self._edits.retract(message_ids, note)

    async def aclose(self) -> None:
        await self._pacer.aclose()
        await self._edits.aclose()

    def show_status(self, status: str) -> None:
        """Show `status` as the draft's status line ("" removes it): an approval awaited."""
        if self._pacer.closed or not self._drafting:
            return
        self._status = status
        self._pacer.wake()

    def __call__(self, event: LoopEvent) -> None:
        if self._pacer.closed:
            return
        if not self._drafting:
            self._edits(event)
            return
        if (status := status_line(event)) is not None:
            self._status = status
        match event:
            case TextDelta(text=text):
                self._text += text
            case StreamRestarted(discard=True):
                self._text = self._text[: self._segment]
            case LLMCallStarted():
                self._segment = len(self._text)
            case ToolStarted() | ToolFinished() | CompactionProgress() | Notice():
                pass  # the status line changed (`status_line`)
            case _:
                return
        self._pacer.wake()

    async def _flush(self) -> None:
        text = scrub(self._text)
        if text.strip() and may_become_silent(text):
            text = ""  # it may yet turn out silent: show the placeholder meanwhile
        draft = _with_status(text, self._status, DRAFT_LIMIT)
        if draft == self._shown:
            return
        # Until the draft is sent `finish` may give it up: the final answer never waits
        # behind the first draft's preparation or other chats' drafts (the shared budget).
        self._pacer.in_flight = False
        hook, self.before_preview = self.before_preview, None
        await before_first(hook, "draft")
        if self._budget is not None:
            await self._budget.acquire()
        self._pacer.in_flight = True  # from here on `finish` lets the call land
        try:
            await self._send(draft)
            self._shown = draft
        except ChannelRateLimited as exc:
            await self._clock.sleep(max(exc.retry_after, 0.0))
            self._pacer.wake()
        except ChannelRefused as exc:
            log.info("telegram: drafts refused here (%s); streaming by edits", exc)
            if self._unsupported is not None:
                self._unsupported()
            self._fall_back()
        except ChannelError as exc:  # Telegram away for now: a later update may go through
            log.info("telegram: draft update failed: %s", exc)
        finally:
            self._pacer.sent()
            if self._budget is not None:
                self._budget.landed()

    async def _send(self, text: str) -> None:
        await telegram_call(
            self._bot.send_message_draft(
                chat_id=self._chat_id,
                draft_id=self._draft_id,
                text=text,
                message_thread_id=self._thread_id,
            )
        )

    def _fall_back(self) -> None:
        self._drafting = False
        self._edits.on_posted = self.on_posted
        self._edits.before_preview = self.before_preview
        if self._text:
            self._edits(TextDelta(self._text))

    async def finish(self, text: str) -> None:
        try:
            await self._pacer.stop()  # a draft call in flight lands first
            if not self._drafting:
                await self._edits.finish(text)
                return
            # The final text is a message of its own; the draft gives way to it.
            self._ids = await deliver(self._surface, text, clock=self._clock)
        finally:
            await self.aclose()
