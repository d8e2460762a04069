"""The Telegram channel, on python-telegram-bot (SPEC §9).

Updates arrive by long polling (default) or by a webhook whose secret-token header is
checked. DMs are always answered; in groups the bot answers when mentioned, when a
message replies to one of its own, or for a bot command, and replies to the triggering
message in the same forum topic. Replies stream by editing one message (plain text),
the final text is sent as Telegram HTML with a plain-text fallback. Approvals are
inline-keyboard buttons answered through callback queries.

PTB's own retrying rate limiter is not used: the reply streamer handles 429 itself and
must see it as `ChannelRateLimited` (every Bot API error goes through `telegram_call`).

Stored before confirmed: Telegram forgets an update once it is confirmed — by a later
`getUpdates` offset past it, or by the webhook's 200 — so both wait until the update is
taken in: a message stored by the agent as a queued run (or dropped as a redelivery), a
command started (commands store nothing), anything else handled. PTB's `Updater` confirms
each batch as soon as it has fetched it, so polling is driven here (`_poll`) instead; the
webhook answers once the update is taken in, 500 if that failed. An update whose hand-over
failed is not confirmed, and Telegram delivers it again.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.ext import (
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from channels.approvals import Approvals, approval_button_id, parse_approval_button
from channels.gate import Gate
from channels.inbound import telegram_markdown
from channels.retry import call_with_retry
from channels.stream import ReplyStreamer, Typing, deliver
from channels.telegram_config import TelegramConfig
from channels.text import to_telegram_html
from core.chat import (
    AgentPort,
    ApprovalRequest,
    ConversationKey,
    Inbound,
    PromptRef,
    ReplyStream,
    Responder,
    is_silent,
    valid_text,
)
from core.clock import Clock, SystemClock
from core.command_table import COMMAND_TABLE, COMMANDS, parse_command
from core.errors import (
    ChannelError,
    ChannelRateLimited,
    ChannelRefused,
    ChannelUnavailable,
    ConfigError,
)

# PTB ≥ 22.2 warns on every int-valued time period unless opted in to timedelta values.
os.environ.setdefault("PTB_TIMEDELTA", "1")

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 4096  # characters after entity parsing (counted in UTF-16 units here)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = ("message", "callback_query")
_ALIASES = {"start": "help"}  # Telegram clients send /start when a user opens the bot
_PROMPT_SUMMARY_LIMIT = 3000
POLL_TIMEOUT = timedelta(seconds=10)  # long poll
HANDOVER_WAIT = 1.0  # seconds to wait for unfinished hand-overs before polling again
POLL_BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # waits while getUpdates fails; 30 s repeats
_T = TypeVar("_T")


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


# PTB's exceptions carry no HTTP status; each refusal class stands for one (InvalidToken
# also for 404). BadRequest is a NetworkError subclass, so these are checked first.
_REFUSALS: tuple[tuple[type[TelegramError], int], ...] = (
    (BadRequest, 400),
    (ChatMigrated, 400),
    (InvalidToken, 401),
    (Forbidden, 403),
    (Conflict, 409),
)


async def telegram_call(call: Awaitable[_T]) -> _T:
    """Await a Bot API call; PTB's errors become channel errors (`core.errors`): 429 →
    `ChannelRateLimited`, 5xx and network trouble → `ChannelUnavailable`, any other
    error answer → `ChannelRefused`, whose `code` is Telegram's error description
    (Telegram has no error codes)."""
    try:
        return await call
    except RetryAfter as exc:
        raise ChannelRateLimited(_seconds(exc.retry_after)) from exc
    except TelegramError as exc:
        status = next((status for kind, status in _REFUSALS if isinstance(exc, kind)), None)
        if status is None and isinstance(exc, NetworkError):  # TimedOut, 5xx, connection
            raise ChannelUnavailable(f"telegram: {exc.message}") from exc
        refusal = f"telegram refused the call: {exc.message}"
        raise ChannelRefused(refusal, status=status, code=exc.message) from exc


def _says(exc: ChannelRefused, phrase: str) -> bool:
    return phrase in (exc.code or "").lower()


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
        except ChannelRefused as exc:
            if not _says(exc, "message is not modified"):
                raise

    async def delete(self, message_id: str) -> None:
        try:
            await telegram_call(self._bot.delete_message(self._place.chat_id, int(message_id)))
        except ChannelRefused as exc:
            if not _says(exc, "not found"):
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
                if not _says(exc, "can't parse entities"):
                    raise
                log.info("telegram: HTML rejected (%s); sending plain text", exc.code)
        return await telegram_call(call(text, None))


@dataclasses.dataclass(frozen=True, slots=True)
class _Handover:
    """A message on its way to the agent; `taken` (if any) is done once it was submitted,
    which for a message means stored."""

    inbound: Inbound
    responder: Responder
    taken: asyncio.Future[None] | None = None

    def done(self) -> None:
        if self.taken is not None and not self.taken.done():
            self.taken.set_result(None)

    def failed(self, exc: Exception) -> None:
        if self.taken is not None and not self.taken.done():
            self.taken.set_exception(exc)


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
        await telegram_call(
            self._channel.app.bot.send_chat_action(
                self._place.chat_id, ChatAction.TYPING, message_thread_id=self._place.thread_id
            )
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
            .updater(None)  # polling is ours: see `_poll`
            .build()
        )
        self.app.add_handler(
            MessageHandler(filters.UpdateType.MESSAGE & filters.TEXT, self._on_message)
        )
        self.app.add_handler(CallbackQueryHandler(self._on_callback, block=False))
        self.app.add_error_handler(self._on_error)
        self._agent: AgentPort | None = None
        self._inboxes: dict[ConversationKey, asyncio.Queue[_Handover]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._taking: dict[int, asyncio.Future[None]] = {}  # id(update) → taken in
        self._poller: asyncio.Task[None] | None = None
        self._offset = 0  # every update below it is taken in
        self._handovers: dict[int, asyncio.Future[None]] = {}  # polled, at or past the offset
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
                await self.app.bot.delete_webhook()  # getUpdates is refused while one is set
                self._poller = asyncio.create_task(self._poll(), name="telegram polling")
                self._poller.add_done_callback(_poller_ended)
        except BaseException:
            await self.stop()
            raise
        log.info("telegram: @%s started (%s)", self._bot_username, self.config.mode)

    async def stop(self) -> None:
        """Stop taking updates, hand over what was already received, close connections."""
        if self._webhook is not None:
            runner, self._webhook = self._webhook, None
            await runner.cleanup()
        polling = self._poller is not None
        if self._poller is not None:
            poller, self._poller = self._poller, None
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        if self.app.running:
            await self.app.stop()
        if self._workers:  # hand what was received to the agent
            await asyncio.gather(*self._workers, return_exceptions=True)
        if polling:
            self._advance(self._handovers)
            await self._confirm()
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
        commands = [BotCommand(spec.name, spec.summary) for spec in COMMAND_TABLE]
        try:
            await telegram_call(self.app.bot.set_my_commands(commands))
        except ChannelError as exc:  # the bot still works; only the "/" menu is missing
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
        taken = await self._dispatch(update)
        try:
            await asyncio.shield(taken)
        except Exception:  # logged where it failed; Telegram delivers the update again
            return web.Response(status=500, text="update not taken in")
        return web.Response(text="ok")

    # ------------------------------------------------------------------ polling

    async def _poll(self) -> None:
        """Long polling that confirms an update only once it is taken in.

        The offset sent to `getUpdates` confirms every update below it, so it stays at the
        first update still being taken in. Until that one is done, polls return at once
        (with it again: skipped) after waiting up to `HANDOVER_WAIT` for it, so a slow
        hand-over in one chat holds back the confirmation, not the other chats.
        """
        handovers = self._handovers
        while True:
            updates = await call_with_retry(
                self._fetch_updates,
                clock=self.clock,
                attempts=None,  # polling goes on until stopped, however long Telegram is away
                backoff=POLL_BACKOFF,
                rate_limits=None,
                what="telegram getUpdates",
            )
            for update in updates:
                if update.update_id not in handovers:
                    handovers[update.update_id] = await self._dispatch(update)
            unfinished = [h for h in handovers.values() if not h.done()]
            if unfinished:
                await asyncio.wait(unfinished, timeout=HANDOVER_WAIT)
            if not self._advance(handovers):
                await self.clock.sleep(HANDOVER_WAIT)  # a failed hand-over: retry it calmly

    async def _fetch_updates(self) -> tuple[Update, ...]:
        """One `getUpdates` from the offset. A refusal counts as an outage here: Telegram
        answers 409 while a webhook or another poller holds the updates, which passes."""
        try:
            return await telegram_call(
                self.app.bot.get_updates(
                    offset=self._offset,
                    timeout=timedelta(0) if self._handovers else POLL_TIMEOUT,
                    allowed_updates=list(ALLOWED_UPDATES),
                )
            )
        except ChannelRefused as exc:
            raise ChannelUnavailable(str(exc)) from exc

    def _advance(self, handovers: dict[int, asyncio.Future[None]]) -> bool:
        """Move the offset past the updates taken in, up to the first that is not; False
        if one failed (it is forgotten here, so the next poll takes it in again)."""
        for update_id in sorted(handovers):
            handover = handovers[update_id]
            if not handover.done():
                return True
            del handovers[update_id]
            if handover.cancelled() or handover.exception() is not None:
                return False
            self._offset = max(self._offset, update_id + 1)
        return True

    async def _confirm(self) -> None:
        """Tell Telegram what was taken in before stopping, so a restart does not fetch
        it again (it would be dropped as a redelivery anyway)."""
        if not self._offset:
            return
        with contextlib.suppress(ChannelError):
            await telegram_call(
                self.app.bot.get_updates(
                    offset=self._offset, timeout=timedelta(0), allowed_updates=list(ALLOWED_UPDATES)
                )
            )

    async def _dispatch(self, update: Update) -> asyncio.Future[None]:
        """Run PTB's handlers on `update`; returns what is done once it is taken in."""
        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._taking[id(update)] = taken  # by object: a redelivery may be in flight too
        try:
            await self.app.process_update(update)
        except Exception:  # PTB reports handler errors itself; this is PTB failing
            log.exception("telegram: update %s could not be processed", update.update_id)
        finally:
            # A message handler claims its hand-over; anything else is done when handled.
            if self._taking.pop(id(update), None) is taken and not taken.done():
                taken.set_result(None)
        return taken

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
        if (text := valid_text(message.text)) is not message.text:
            # A lone surrogate: PTB's entity parsing (UTF-16) would fail on it. U+FFFD is one
            # UTF-16 unit as well, so the entities' offsets still fit the valid copy.
            message = Message.de_json(message.to_dict() | {"text": text}, self.app.bot)
        inbound = self._inbound(update.update_id, message, sender, text)
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
        taken = self._taking.pop(id(update), None)
        if taken is not None and parse_command(inbound.text) is not None:
            taken.set_result(None)  # commands act at once and store nothing
            taken = None
        self._enqueue(_Handover(inbound, _Responder(self, place), taken))

    def _inbound(self, update_id: int, message: Message, sender: User, text: str) -> Inbound | None:
        """The message as an `Inbound`, or None if it is empty or a command for another bot.
        The agent gets the text as Markdown (`channels.inbound`); `message.text` stays raw."""
        markdown = telegram_markdown(text, message.entities)
        commands = message.parse_entities([MessageEntity.BOT_COMMAND]).items()
        command = next(((e, value) for e, value in commands if e.offset == 0), None)
        if command is not None:
            name, _, target = command[1][1:].partition("@")
            if target and target.lower() != self._bot_username.lower():
                return None
            name = _ALIASES.get(name.lower(), name.lower())
            # The command is ASCII (no UTF-16 shift) and begins the Markdown unless it was
            # itself formatted (then the arguments are taken as typed).
            rest = markdown if markdown.startswith(command[1]) else text
            args = rest[len(command[1]) :].strip()
            ours = bool(target) or name in COMMANDS
            if not ours and message.chat.type != ChatType.PRIVATE:
                return None  # another bot's command in a group (/roll, /shrug): not for us
            text, mentioned = f"/{name} {args}".rstrip(), ours
        else:
            text, mentioned = self._strip_mentions(message, markdown)
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

    def _strip_mentions(self, message: Message, text: str) -> tuple[str, bool]:
        """`text` (the message as Markdown) without the bot's @mentions, and whether there
        was one. A text mention of the bot reads `@botname` in Markdown, so it goes too."""
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

    def _enqueue(self, handover: _Handover) -> None:
        """Submit in update order per conversation, off PTB's update processing: a slow
        submit (a command such as /compact runs inside it) never holds up other chats or
        the approval button clicks a running turn waits for."""
        key = handover.inbound.key
        inbox = self._inboxes.get(key)
        if inbox is None:
            inbox = self._inboxes[key] = asyncio.Queue()
            worker = asyncio.create_task(self._submit_all(key, inbox))
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        inbox.put_nowait(handover)

    async def _submit_all(self, key: ConversationKey, inbox: asyncio.Queue[_Handover]) -> None:
        try:
            while not inbox.empty():
                handover = inbox.get_nowait()
                try:
                    if self._agent is not None:
                        await self._agent.submit(handover.inbound, handover.responder)
                except Exception as exc:
                    log.exception("telegram: submitting event %s failed", handover.inbound.event_id)
                    handover.failed(exc)
                else:
                    handover.done()
        finally:
            del self._inboxes[key]

    # ------------------------------------------------------------------ approvals

    async def ask_approval(self, place: _Place, request: ApprovalRequest) -> bool:
        """Post the prompt with Approve/Deny buttons and wait for an approver."""
        bot = self.app.bot

        async def show(req: ApprovalRequest) -> PromptRef:
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
            message = await call_with_retry(
                lambda: telegram_call(
                    bot.send_message(text=text, reply_markup=buttons, **place.kwargs())
                ),
                clock=self.clock,
                what="telegram approval prompt",
            )
            return PromptRef(str(place.chat_id), str(message.message_id), text)

        return await self._approvals.request(request, show, self._settle_prompt)

    async def _settle_prompt(self, request: ApprovalRequest, outcome: str) -> None:
        """Edit the prompt to show the outcome; an edit without reply_markup removes the
        buttons. A failed edit must not turn the decision around, so it is only logged."""
        prompt = request.prompt
        if prompt is None:
            return
        try:
            await call_with_retry(
                lambda: telegram_call(
                    self.app.bot.edit_message_text(
                        f"{prompt.text}\n\n{outcome}",
                        chat_id=int(prompt.channel_id),
                        message_id=int(prompt.message_id),
                    )
                ),
                clock=self.clock,
                what="telegram approval settle",
            )
        except ChannelError as exc:
            log.warning("telegram: could not settle approval prompt %s: %s", request.id, exc)

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
            verdict = await self._approvals.resolve_click(
                request_id,
                str(user.id),
                user.username or user.full_name,
                allow,
                agent=self._agent,
                settle=self._settle_prompt,
            )
            answer = {
                "ok": ("Approved" if allow else "Denied", False),
                "not_approver": ("Only the configured approvers can answer this request.", True),
                "unknown": ("This request is no longer pending.", True),
            }[verdict]
        text, alert = answer
        try:
            await telegram_call(query.answer(text, show_alert=alert))
        except ChannelError as exc:
            log.warning("telegram: answerCallbackQuery failed: %s", exc)

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        log.error("telegram: error while handling an update", exc_info=context.error)


def _poller_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.critical("telegram: polling stopped: %s", exc, exc_info=exc)


def _prompt_text(request: ApprovalRequest) -> str:
    summary = request.summary
    if len(summary) > _PROMPT_SUMMARY_LIMIT:
        summary = summary[:_PROMPT_SUMMARY_LIMIT] + "…"
    lines = [f"🔐 Approval needed: {request.tool}", summary]
    if request.reason:
        lines.append(f"Reason: {request.reason}")
    return "\n".join(lines)


__all__ = ["TelegramChannel"]
