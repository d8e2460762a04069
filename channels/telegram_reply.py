"""Where the bot's output goes in Telegram: a chat (or forum topic) as a `Surface` for the
reply streamer — final text as Telegram HTML, plain text if Telegram cannot parse it —
the `Responder` of one conversation with its typing indicator, the approval prompt, and
the header of a trigger's thread (`start_thread`): Telegram has no threads outside forum
topics, so a trigger's posts reply to its header, and its key's thread is `r<header id>`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, Message, ReplyParameters
from telegram.constants import ChatAction, ParseMode

from channels.approvals import ALWAYS_LABELS, approval_button_id
from channels.stream import EditBudget, ReplyStreamer, Typing, deliver
from channels.telegram_api import says, telegram_call
from channels.telegram_config import TelegramConfig
from channels.telegram_draft import DraftStream
from channels.text import to_telegram_html
from core.chat import ApprovalRequest, PreviewStream, is_silent
from core.clock import Clock
from core.errors import ChannelRefused, DeliveryFailed
from core.records import record

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 4096  # characters after entity parsing (counted in UTF-16 units here)
_PROMPT_SUMMARY_LIMIT = 3000
APPROVAL_STATUS = "🔐 waiting for approval"
_T = TypeVar("_T")


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class TelegramHost(Protocol):
    """What a responder uses of its channel (`channels.telegram.TelegramChannel`)."""

    clock: Clock
    config: TelegramConfig
    drafts_supported: bool
    draft_budget: EditBudget

    def no_drafts(self) -> None: ...

    @property
    def bot(self) -> Bot:
        """The bot's API client (built with the channel, usable once it started)."""

    async def ask_approval(self, place: Place, request: ApprovalRequest) -> bool: ...


@record(frozen=True, slots=True)
class Place:
    """Where one conversation's messages go."""

    chat_id: int
    thread_id: int | None = None  # forum topic
    reply_to: int | None = None  # the triggering message, in groups

    def kwargs(self) -> dict[str, Any]:
        args: dict[str, Any] = {"chat_id": self.chat_id}
        if self.thread_id is not None:
            args["message_thread_id"] = self.thread_id
        if self.reply_to is not None:
            args["reply_parameters"] = ReplyParameters(
                message_id=self.reply_to, allow_sending_without_reply=True
            )
        return args


def place_of(chat_id: str, thread: str) -> Place:
    """Where the conversation (`telegram`, chat_id, thread) posts: `r<id>` replies to
    message <id> (a trigger's thread), digits are a forum topic, "" the chat itself."""
    if thread.startswith("r"):
        return Place(int(chat_id), None, reply_to=int(thread[1:]))
    return Place(int(chat_id), int(thread) if thread else None)


async def start_thread(channel: TelegramHost, chat_id: str, header: str) -> str:
    """Post `header` in chat `chat_id` as a responder posts (retried, 429s waited out) and
    return `r<its message id>`. Raises DeliveryFailed with Telegram's reason if it cannot
    be posted."""
    try:
        place = Place(int(chat_id))
    except ValueError:
        raise DeliveryFailed(f"not a Telegram chat id: {chat_id!r}") from None
    posted = await deliver(TelegramSurface(channel.bot, place), header, clock=channel.clock)
    if not posted:
        raise DeliveryFailed("an empty thread header is not posted")
    return f"r{posted[0]}"


class TelegramSurface:
    """One Telegram chat (or topic) as a `stream.Surface`."""

    limit = MESSAGE_LIMIT

    def __init__(self, bot: Bot, place: Place) -> None:
        self._bot = bot
        self._place = place

    def measure(self, text: str) -> int:
        # The Markdown source is never shorter than the visible text of its HTML.
        return _utf16_len(text)

    async def post(self, text: str, *, final: bool) -> str:
        args = self._place.kwargs()

        async def send(body: str, mode: str | None) -> Message:
            return await self._bot.send_message(text=body, parse_mode=mode, **args)

        message = await self._formatted(send, text, final=final)
        return str(message.message_id)

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        async def edit(body: str, mode: str | None) -> object:
            return await self._bot.edit_message_text(
                body, chat_id=self._place.chat_id, message_id=int(message_id), parse_mode=mode
            )

        try:
            await self._formatted(edit, text, final=final)
        except ChannelRefused as exc:
            if not says(exc, "message is not modified"):
                raise

    async def delete(self, message_id: str) -> None:
        try:
            await telegram_call(self._bot.delete_message(self._place.chat_id, int(message_id)))
        except ChannelRefused as exc:
            if not says(exc, "not found"):
                raise

    @staticmethod
    async def _formatted(
        call: Callable[[str, str | None], Awaitable[_T]], text: str, *, final: bool
    ) -> _T:
        """Final text as HTML, falling back to plain text if Telegram cannot parse it."""
        if final:
            try:
                return await telegram_call(call(to_telegram_html(text), ParseMode.HTML))
            except ChannelRefused as exc:
                if not says(exc, "can't parse entities"):
                    raise
                log.info("telegram: HTML rejected (%s); sending plain text", exc.code)
        return await telegram_call(call(text, None))


class TelegramResponder:
    """A `core.chat.Responder` for one place in Telegram."""

    def __init__(self, channel: TelegramHost, place: Place) -> None:
        self._channel = channel
        self._place = place
        self._surface = TelegramSurface(channel.bot, place)
        self._draft: DraftStream | None = None  # the latest answer's draft (approvals show)

    async def send(self, text: str) -> None:
        if not is_silent(text):
            await deliver(self._surface, text, clock=self._channel.clock)

    def stream(self) -> PreviewStream:
        channel = self._channel
        edits = ReplyStreamer(
            self._surface,
            clock=channel.clock,
            min_interval=channel.config.edit_interval_seconds,
            typing=self._send_typing,
            status_lines=True,  # a tool step or a compaction: one line under the preview
        )
        private = self._place.chat_id > 0  # Telegram's private chats have positive ids
        if not (private and channel.config.drafts and channel.drafts_supported):
            return edits  # groups keep edits
        self._draft = DraftStream(
            channel.bot,
            self._place.chat_id,
            self._place.thread_id,
            edits,
            clock=channel.clock,
            min_interval=channel.config.edit_interval_seconds,
            budget=channel.draft_budget,
            unsupported=channel.no_drafts,
        )
        return self._draft

    async def approve(self, request: ApprovalRequest) -> bool:
        draft = self._draft
        if draft is not None:
            draft.show_status(APPROVAL_STATUS)
        try:
            return await self._channel.ask_approval(self._place, request)
        finally:
            if draft is not None:
                draft.show_status("")

    def typing(self) -> AbstractAsyncContextManager[None]:
        return Typing(self._send_typing, clock=self._channel.clock)

    async def _send_typing(self) -> None:
        await telegram_call(
            self._channel.bot.send_chat_action(
                self._place.chat_id, ChatAction.TYPING, message_thread_id=self._place.thread_id
            )
        )


def approval_prompt(request: ApprovalRequest) -> tuple[str, InlineKeyboardMarkup]:
    """The prompt's text (what is asked and why) and its Approve / Deny buttons."""
    summary = request.summary
    if len(summary) > _PROMPT_SUMMARY_LIMIT:
        summary = summary[:_PROMPT_SUMMARY_LIMIT] + "…"
    lines = [f"🔐 Approval needed: {request.tool}", summary]
    if request.reason:
        lines.append(f"Reason: {request.reason}")
    approve = InlineKeyboardButton("✅ Approve", callback_data=approval_button_id(request.id, True))
    deny = InlineKeyboardButton("❌ Deny", callback_data=approval_button_id(request.id, False))
    rows = [[approve, deny]]
    if request.grantable:  # "approve always": a durable grant, on a row of its own
        rows.append(
            [
                InlineKeyboardButton(
                    f"♾ {label}", callback_data=approval_button_id(request.id, True, scope)
                )
                for scope, label in ALWAYS_LABELS.items()
            ]
        )
    return "\n".join(lines), InlineKeyboardMarkup(rows)
