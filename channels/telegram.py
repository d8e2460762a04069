"""The Telegram channel, on python-telegram-bot (SPEC §9).

Updates arrive by long polling (default) or by a webhook whose secret-token header is
checked. DMs are always answered; in groups the bot answers when mentioned, when a
message replies to one of its own, or for a bot command, and replies to the triggering
message in the same forum topic. Replies stream by editing one message (plain text),
the final text is sent as Telegram HTML with a plain-text fallback. Approvals are
inline-keyboard buttons answered through callback queries.

PTB's own retrying rate limiter is not used: the reply streamer handles 429 itself and
must see it as `stream.RateLimited`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web
from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    ReplyParameters,
    Update,
    User,
)
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.ext import (
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from channels.approvals import Approvals, approval_button_id, parse_approval_button
from channels.gate import Gate
from channels.stream import RateLimited, ReplyStreamer, TransientError, Typing, deliver
from channels.text import to_telegram_html
from core.chat import (
    AgentPort,
    ApprovalRequest,
    ConversationKey,
    Inbound,
    ReplyStream,
    Responder,
    is_silent,
)
from core.clock import Clock, SystemClock
from core.config import TelegramConfig
from core.errors import ConfigError

# PTB ≥ 22.2 warns on every int-valued time period unless opted in to timedelta values.
os.environ.setdefault("PTB_TIMEDELTA", "1")

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 4096  # characters after entity parsing (counted in UTF-16 units here)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ("message", "callback_query")
COMMANDS: tuple[tuple[str, str], ...] = (
    ("help", "What the bot can do"),
    ("status", "Provider, context use, goal and run state"),
    ("clear", "Start a fresh conversation"),
    ("compact", "Summarise the conversation to free context"),
    ("stop", "Stop the running turn"),
    ("resume", "Resume an interrupted run"),
    ("provider", "Show or switch the provider: /provider [name]"),
    ("goal", "Show or set a goal: /goal create <text>"),
    ("journal", "Show the journal"),
)
_OUR_COMMANDS = frozenset(name for name, _ in COMMANDS)
_ALIASES = {"start": "help"}  # Telegram clients send /start when a user opens the bot
_PROMPT_SUMMARY_LIMIT = 3000
_T = TypeVar("_T")


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


async def _mapped(call: Awaitable[_T]) -> _T:
    """Await a Bot API call, mapping PTB's errors onto the streamer's: 429 → RateLimited,
    network trouble and 5xx → TransientError; 400/403 stay permanent."""
    try:
        return await call
    except RetryAfter as exc:
        raise RateLimited(_seconds(exc.retry_after)) from exc
    except BadRequest:
        raise
    except NetworkError as exc:  # TimedOut, 5xx, connection errors
        raise TransientError(str(exc)) from exc


def _says(exc: TelegramError, phrase: str) -> bool:
    return phrase in exc.message.lower()


@dataclasses.dataclass(frozen=True, slots=True)
class _Place:
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


class _Surface:
    """One Telegram chat (or topic) as a `stream.Surface`."""

    limit = MESSAGE_LIMIT

    def __init__(self, bot: Bot, place: _Place) -> None:
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
        except BadRequest as exc:
            if not _says(exc, "message is not modified"):
                raise

    async def delete(self, message_id: str) -> None:
        try:
            await _mapped(self._bot.delete_message(self._place.chat_id, int(message_id)))
        except BadRequest as exc:
            if not _says(exc, "not found"):
                raise

    @staticmethod
    async def _formatted(
        call: Callable[[str, str | None], Awaitable[_T]], text: str, *, final: bool
    ) -> _T:
        """Final text as HTML, falling back to plain text if Telegram cannot parse it."""
        if final:
            try:
                return await _mapped(call(to_telegram_html(text), ParseMode.HTML))
            except BadRequest as exc:
                if not _says(exc, "can't parse entities"):
                    raise
                log.info("telegram: HTML rejected (%s); sending plain text", exc.message)
        return await _mapped(call(text, None))


class _Responder:
    """A `core.chat.Responder` for one place in Telegram."""

    def __init__(self, channel: TelegramChannel, place: _Place) -> None:
        self._channel = channel
        self._place = place
        self._surface = _Surface(channel.app.bot, place)

    async def send(self, text: str) -> None:
        if not is_silent(text):
            await deliver(self._surface, text, clock=self._channel.clock)

    def stream(self) -> ReplyStream:
        return ReplyStreamer(
            self._surface,
            clock=self._channel.clock,
            min_interval=self._channel.config.edit_interval_seconds,
            typing=self._send_typing,
        )

    async def approve(self, request: ApprovalRequest) -> bool:
        return await self._channel.ask_approval(self._place, request)

    def typing(self) -> AbstractAsyncContextManager[None]:
        return Typing(self._send_typing, clock=self._channel.clock)

    async def _send_typing(self) -> None:
        await self._channel.app.bot.send_chat_action(
            self._place.chat_id, ChatAction.TYPING, message_thread_id=self._place.thread_id
        )


class TelegramChannel:
    """The Telegram adapter (`channels.base.Channel`)."""

    name = "telegram"

    def __init__(
        self,
        config: TelegramConfig,
        environ: Mapping[str, str],
        *,
        clock: Clock | None = None,
    ) -> None:
        token = environ.get(config.token_env, "")
        if not token:
            raise ConfigError(
                "channels.telegram.token_env",
                f"the environment variable {config.token_env} is not set",
                f"export {config.token_env}=<the bot token from @BotFather>",
            )
        self._secret = ""
        if config.mode == "webhook":
            self._secret = self._webhook_secret(config, environ)
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._gate = Gate(config, self.clock)
        self._approvals = Approvals(config.approvers, self.clock)
        base = config.base_url.rstrip("/")
        self.app = (
            ApplicationBuilder()
            .token(token)
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .job_queue(None)  # scheduling is Parley's own (APScheduler in bot/)
            .build()
        )
        self.app.add_handler(
            MessageHandler(filters.UpdateType.MESSAGE & filters.TEXT, self._on_message)
        )
        self.app.add_handler(CallbackQueryHandler(self._on_callback, block=False))
        self.app.add_error_handler(self._on_error)
        self._agent: AgentPort | None = None
        self._inboxes: dict[ConversationKey, asyncio.Queue[tuple[Inbound, Responder]]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._webhook: web.AppRunner | None = None
        self.webhook_port: int | None = None
        self._bot_id = 0
        self._bot_username = ""

    @staticmethod
    def _webhook_secret(config: TelegramConfig, environ: Mapping[str, str]) -> str:
        if not config.webhook_url:
            raise ConfigError(
                "channels.telegram.webhook_url",
                "mode = 'webhook' needs the public URL Telegram posts updates to",
                "set webhook_url = 'https://bot.example.com/telegram', or use mode = 'polling'",
            )
        secret = environ.get(config.webhook_secret_env, "")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            raise ConfigError(
                "channels.telegram.webhook_secret_env",
                f"the environment variable {config.webhook_secret_env} must hold 1-256 "
                "characters A-Z, a-z, 0-9, _ or -",
                f"export {config.webhook_secret_env}=$(openssl rand -hex 32)",
            )
        return secret

    # ------------------------------------------------------------------ lifecycle

    async def start(self, agent: AgentPort) -> None:
        self._agent = agent
        try:
            await self._initialize()
            self._bot_id = self.app.bot.id
            self._bot_username = self.app.bot.username
            await self._register_commands()
            await self.app.start()
            if self.config.mode == "webhook":
                await self._start_webhook()
            else:
                assert self.app.updater is not None
                await self.app.updater.start_polling(
                    poll_interval=0, allowed_updates=list(ALLOWED_UPDATES)
                )
        except BaseException:
            await self.stop()
            raise
        log.info("telegram: @%s started (%s)", self._bot_username, self.config.mode)

    async def stop(self) -> None:
        """Stop taking updates, hand over what was already received, close connections."""
        if self._webhook is not None:
            runner, self._webhook = self._webhook, None
            await runner.cleanup()
        if self.app.updater is not None and self.app.updater.running:
            await self.app.updater.stop()
        if self.app.running:
            await self.app.stop()
        if self._workers:  # hand what was received to the agent
            await asyncio.gather(*self._workers, return_exceptions=True)
        await self.app.shutdown()
        await self.app.bot.shutdown()  # in case initialize() failed half-way

    async def _initialize(self) -> None:
        try:
            await self.app.initialize()  # getMe
        except InvalidToken:
            # `from None`: PTB's message quotes the token, which must not reach any log.
            raise ConfigError(
                "channels.telegram.token_env",
                f"Telegram rejected the bot token in {self.config.token_env}",
                "copy the token again from @BotFather (/mybots → API Token)",
            ) from None

    async def _register_commands(self) -> None:
        commands = [BotCommand(name, text) for name, text in COMMANDS]
        try:
            await self.app.bot.set_my_commands(commands)
        except TelegramError as exc:  # the bot still works; only the "/" menu is missing
            log.warning("telegram: setMyCommands failed: %s", exc)

    async def _start_webhook(self) -> None:
        url = self.config.webhook_url or ""
        app = web.Application()
        app.router.add_post(urlsplit(url).path or "/", self._on_webhook)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._webhook = runner
        site = web.TCPSite(runner, self.config.webhook_listen, self.config.webhook_port)
        await site.start()
        self.webhook_port = int(runner.addresses[0][1])
        await self.app.bot.set_webhook(
            url, secret_token=self._secret, allowed_updates=list(ALLOWED_UPDATES)
        )

    async def _on_webhook(self, request: web.Request) -> web.Response:
        given = request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode(), self._secret.encode()):
            log.warning(
                "telegram: webhook request with a wrong secret token from %s", request.remote
            )
            return web.Response(status=401, text="wrong secret token")
        try:
            data = await request.json()
            if not isinstance(data, dict):
                raise TypeError("an update is a JSON object")
            update = Update.de_json(data, self.app.bot)
        except (ValueError, TypeError, KeyError):
            log.warning("telegram: webhook request with a malformed update")
            return web.Response(status=400, text="malformed update")
        await self.app.update_queue.put(update)
        return web.Response(text="ok")

    # ------------------------------------------------------------------ Channel

    def responder(self, key: ConversationKey) -> Responder:
        _, chat_id, thread = key
        return _Responder(self, _Place(int(chat_id), int(thread) if thread else None))

    def access(self) -> str:
        return self.config.who()

    # ------------------------------------------------------------------ inbound

    async def _on_message(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        sender = message.from_user if message is not None else None
        if message is None or sender is None or message.text is None:
            return
        inbound = self._inbound(update.update_id, message, sender, message.text)
        if inbound is None:
            return
        reply = message.reply_to_message
        in_bot_thread = bool(reply and reply.from_user and reply.from_user.id == self._bot_id)
        if not self._gate.admit(
            inbound,
            from_bot=sender.is_bot,
            from_self=sender.id == self._bot_id,
            in_bot_thread=in_bot_thread,
        ):
            return
        place = _Place(
            message.chat_id,
            int(inbound.thread_id) if inbound.thread_id else None,
            None if inbound.is_dm else message.message_id,
        )
        self._enqueue(inbound, _Responder(self, place))

    def _inbound(self, update_id: int, message: Message, sender: User, text: str) -> Inbound | None:
        """The message as an `Inbound`, or None if it is empty or a command for another bot."""
        commands = message.parse_entities([MessageEntity.BOT_COMMAND]).items()
        command = next(((e, value) for e, value in commands if e.offset == 0), None)
        if command is not None:
            name, _, target = command[1][1:].partition("@")
            if target and target.lower() != self._bot_username.lower():
                return None
            name = _ALIASES.get(name.lower(), name.lower())
            args = text[len(command[1]) :].strip()  # the command is ASCII: no UTF-16 shift
            ours = bool(target) or name in _OUR_COMMANDS
            if not ours and message.chat.type != ChatType.PRIVATE:
                return None  # another bot's command in a group (/roll, /shrug): not for us
            text, mentioned = f"/{name} {args}".rstrip(), ours
        else:
            text, mentioned = self._strip_mentions(message)
        if not text:
            return None
        topic = message.message_thread_id if message.is_topic_message else None
        return Inbound(
            channel=self.name,
            channel_id=str(message.chat_id),
            thread_id=str(topic) if topic else "",
            user_id=str(sender.id),
            user_name=sender.username or sender.full_name,
            text=text,
            is_dm=message.chat.type == ChatType.PRIVATE,
            mentions_bot=mentioned,
            event_id=str(update_id),
            message_id=str(message.message_id),
        )

    def _strip_mentions(self, message: Message) -> tuple[str, bool]:
        """The text without the bot's @mentions, and whether there was one."""
        text = message.text or ""
        handle = f"@{self._bot_username}".lower()
        mentioned = False
        for entity, value in message.parse_entities(
            [MessageEntity.MENTION, MessageEntity.TEXT_MENTION]
        ).items():
            if entity.type == MessageEntity.TEXT_MENTION:
                mentioned |= entity.user is not None and entity.user.id == self._bot_id
            elif value.lower() == handle:
                mentioned = True
        if mentioned and self._bot_username:
            pattern = rf"@{re.escape(self._bot_username)}\b[ \t]?"
            text = re.sub(pattern, "", text, flags=re.IGNORECASE)
        return text.strip(), mentioned

    def _enqueue(self, inbound: Inbound, responder: Responder) -> None:
        """Submit in update order per conversation, off PTB's update processing: a slow
        submit (a command such as /compact runs inside it) never holds up other chats or
        the approval button clicks a running turn waits for."""
        inbox = self._inboxes.get(inbound.key)
        if inbox is None:
            inbox = self._inboxes[inbound.key] = asyncio.Queue()
            worker = asyncio.create_task(self._submit_all(inbound.key, inbox))
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        inbox.put_nowait((inbound, responder))

    async def _submit_all(
        self, key: ConversationKey, inbox: asyncio.Queue[tuple[Inbound, Responder]]
    ) -> None:
        try:
            while not inbox.empty():
                inbound, responder = inbox.get_nowait()
                if self._agent is None:
                    continue
                try:
                    await self._agent.submit(inbound, responder)
                except Exception:
                    log.exception("telegram: submitting event %s failed", inbound.event_id)
        finally:
            del self._inboxes[key]

    # ------------------------------------------------------------------ approvals

    async def ask_approval(self, place: _Place, request: ApprovalRequest) -> bool:
        """Post the prompt with Approve/Deny buttons and wait for an approver."""
        prompts: dict[str, tuple[int, str]] = {}
        bot = self.app.bot

        async def show(req: ApprovalRequest) -> object:
            text = _prompt_text(req)
            buttons = InlineKeyboardMarkup(
                [
                    [
                        InlineKeyboardButton(
                            "✅ Approve", callback_data=approval_button_id(req.id, True)
                        ),
                        InlineKeyboardButton(
                            "❌ Deny", callback_data=approval_button_id(req.id, False)
                        ),
                    ]
                ]
            )
            message = await self._retrying(
                lambda: bot.send_message(text=text, reply_markup=buttons, **place.kwargs())
            )
            prompts[req.id] = (message.message_id, text)
            return message

        async def settle(req: ApprovalRequest, outcome: str) -> None:
            if req.id not in prompts:
                return
            message_id, text = prompts.pop(req.id)
            # An edit without reply_markup removes the buttons. A failed edit must not
            # turn the decision around, so it is only logged.
            try:
                await self._retrying(
                    lambda: bot.edit_message_text(
                        f"{text}\n\n{outcome}", chat_id=place.chat_id, message_id=message_id
                    )
                )
            except (TelegramError, TransientError) as exc:
                log.warning("telegram: could not settle approval prompt %s: %s", req.id, exc)

        return await self._approvals.request(request, show, settle)

    async def _retrying(self, call: Callable[[], Awaitable[_T]], attempts: int = 5) -> _T:
        """A Bot API call with the streamer's rules: wait out 429, retry transient errors."""
        for attempt in range(attempts):
            try:
                return await _mapped(call())
            except RateLimited as exc:
                await self.clock.sleep(exc.retry_after)
            except TransientError:
                if attempt == attempts - 1:
                    raise
                await self.clock.sleep(0.5 * 2**attempt)
        return await _mapped(call())

    async def _on_callback(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        if query is None:
            return
        parsed = parse_approval_button(query.data or "")
        user = query.from_user
        if parsed is None:
            answer: tuple[str | None, bool] = (None, False)
        else:
            request_id, allow = parsed
            verdict = self._approvals.resolve(
                request_id, str(user.id), user.username or user.full_name, allow
            )
            answer = {
                "ok": ("Approved" if allow else "Denied", False),
                "not_approver": ("Only the configured approvers can answer this request.", True),
                "unknown": ("This request is no longer pending.", True),
            }[verdict]
        text, alert = answer
        try:
            await query.answer(text, show_alert=alert)
        except TelegramError as exc:
            log.warning("telegram: answerCallbackQuery failed: %s", exc)

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("telegram: error while handling an update", exc_info=context.error)


def _prompt_text(request: ApprovalRequest) -> str:
    summary = request.summary
    if len(summary) > _PROMPT_SUMMARY_LIMIT:
        summary = summary[:_PROMPT_SUMMARY_LIMIT] + "…"
    lines = [f"🔐 Approval needed: {request.tool}", summary]
    if request.reason:
        lines.append(f"Reason: {request.reason}")
    return "\n".join(lines)


__all__ = ["COMMANDS", "TelegramChannel"]
