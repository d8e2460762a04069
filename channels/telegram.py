"""The Telegram channel, on python-telegram-bot (docs/channels.md).

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
each batch as soon as it has fetched it, so polling is driven by Parley (`telegram_poll`);
the webhook answers once the update is taken in, 500 if that failed. An update whose
hand-over failed is not confirmed, and Telegram delivers it again.

Poison updates: an update PTB cannot parse, or whose fields have the wrong shape, is set
aside — one warning line, its JSON recorded for the operator (`AgentPort.record_unreadable`)
— and confirmed (offset, webhook 200) once that record is committed; it stops nothing.

This module is the adapter's lifecycle and its handlers; beside it are the long poll
(`telegram_poll`), the Bot API edge and its error mapping (`telegram_api`), where answers
go and the approval prompt (`telegram_reply`), updates read from JSON and messages read as
`Inbound` (`telegram_updates`) and the settings (`telegram_config`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

from aiohttp import web
from telegram import Bot, BotCommand, Message, Update
from telegram.error import InvalidToken
from telegram.ext import (
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from channels.approvals import Approvals, parse_approval_button
from channels.gate import Gate
from channels.retry import call_with_retry
from channels.stream import EditBudget
from channels.telegram_api import bot_id_of, telegram_call
from channels.telegram_config import TelegramConfig, webhook_secret
from channels.telegram_poll import ALLOWED_UPDATES, Poller
from channels.telegram_reply import (
    Place,
    TelegramResponder,
    approval_prompt,
    place_of,
    start_thread,
)
from channels.telegram_updates import (
    Handover,
    MessageReader,
    raw_json,
    read_update,
    update_id_of,
)
from core.chat import (
    AgentPort,
    ApprovalRequest,
    ConversationKey,
    Deciders,
    PromptRef,
    Responder,
    valid_text,
)
from core.clock import Clock, SystemClock
from core.command_table import COMMAND_TABLE
from core.errors import ChannelError, ConfigError
from core.lease import Singleton

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
DRAFTS_PER_SECOND = 25  # draft updates across the bot's chats (Telegram allows ~30 calls/s)


class TelegramChannel:
    """The Telegram adapter (`channels.base.Channel`)."""

    name = "telegram"

    def __init__(
        self,
        config: TelegramConfig,
        environ: Mapping[str, str],
        *,
        clock: Clock | None = None,
        deciders: Deciders | None = None,
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
            self._secret = webhook_secret(config, environ)
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._gate = Gate(config, self.clock)
        self._approvals = Approvals(
            config.approvers, self.clock, deciders=deciders, platform=self.name
        )
        base = config.base_url.rstrip("/")
        self.app = (
            ApplicationBuilder()
            .token(token)
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .job_queue(None)  # scheduling is Parley's own (APScheduler in bot/)
            .updater(None)  # polling is ours: `channels.telegram_poll`
            .build()
        )
        self.app.add_handler(
            MessageHandler(filters.UpdateType.MESSAGE & filters.TEXT, self._on_message)
        )
        self.app.add_handler(CallbackQueryHandler(self._on_callback, block=False))
        self.app.add_error_handler(self._on_error)
        self._agent: AgentPort | None = None
        self._inboxes: dict[ConversationKey, asyncio.Queue[Handover]] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._taking: dict[int, asyncio.Future[None]] = {}  # id(update) → taken in
        self._poller: asyncio.Task[None] | None = None
        self._polling = Poller(self.app.bot, self.clock, self._dispatch, self._set_aside)
        self._webhook: web.AppRunner | None = None
        self.webhook_port: int | None = None
        self._reader = MessageReader()  # who the bot is: known once started
        self._leased = False  # polling is a leased singleton, run by `singletons()`' caller
        self._bot_id = bot_id_of(token)
        self.drafts_supported = True  # until Telegram refuses a private chat's draft
        self.draft_budget = EditBudget(DRAFTS_PER_SECOND, 1.0, self.clock)

    def no_drafts(self) -> None:
        self.drafts_supported = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self, agent: AgentPort) -> None:
        self._agent = agent
        try:
            await self._initialize()
            self._reader = MessageReader(self.app.bot.id, self.app.bot.username, self.name)
            await self._register_commands()
            await self.app.start()
            if self.config.mode == "webhook":
                await self._start_webhook()
            elif not self._leased:
                await self.app.bot.delete_webhook()  # getUpdates is refused while one is set
                self._poller = asyncio.create_task(self._polling.run(), name="telegram polling")
                self._poller.add_done_callback(_poller_ended)
        except BaseException:
            await self.stop()
            raise
        log.info("telegram: @%s started (%s)", self._reader.username, self.config.mode)

    def singletons(self) -> list[Singleton]:
        """Long polling, for the caller to run while it holds `telegram:poll:<bot id>`
        (several workers on one store: Telegram answers 409 to a second poller); `start`
        then leaves it out. A webhook is no singleton: any worker may answer it."""
        if self.config.mode == "webhook":
            return []
        self._leased = True
        return [Singleton(f"telegram:poll:{self._bot_id}", self._leased_poll)]

    async def _leased_poll(self) -> None:
        """Poll while the lease is held. When it ends nothing more is confirmed (the lease
        may be another's by then): the next holder fetches again what was not confirmed,
        and drops as redeliveries the messages already stored here."""
        await telegram_call(self.app.bot.delete_webhook())
        await self._polling.run()

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
            await self._polling.settle()
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
            data = await request.json()  # not UTF-8: UnicodeDecodeError, a ValueError
        except ValueError:
            data = None
        if not isinstance(data, dict):
            log.warning("telegram: webhook request whose body is no JSON object")
            return web.Response(status=400, text="malformed update")
        update = read_update(data, self.app.bot)
        if isinstance(update, str):  # set aside: answered 200 once recorded, 500 if not
            failed = await self._set_aside(update_id_of(data), data, update)
            return web.Response(status=500 if failed else 200, text="set aside")
        taken = await self._dispatch(update)
        try:
            await asyncio.shield(taken)
        except Exception:  # logged where it failed; Telegram delivers the update again
            return web.Response(status=500, text="update not taken in")
        return web.Response(text="ok")

    # ------------------------------------------------------------------ updates

    async def _set_aside(
        self, update_id: int | None, raw: object, problem: str
    ) -> Exception | None:
        """An update that cannot be taken in: one warning line, and its JSON recorded for
        the operator. Returns why recording failed, if it did (the update is then not
        confirmed: it comes again and is recorded then)."""
        what = "an update without an id" if update_id is None else f"update {update_id}"
        log.warning(
            "telegram: %s set aside: %s (its JSON is in the event channel.event.unparsable)",
            what,
            problem,
        )
        if self._agent is None:
            return None
        event_id = "" if update_id is None else str(update_id)
        try:
            await self._agent.record_unreadable(self.name, event_id, problem, raw_json(raw))
        except Exception as exc:
            log.warning("telegram: %s could not be recorded (%s); it comes again", what, exc)
            return exc
        return None

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

    @property
    def bot(self) -> Bot:
        return self.app.bot

    def responder(self, key: ConversationKey) -> Responder:
        _, chat_id, thread = key
        return TelegramResponder(self, place_of(chat_id, thread))

    async def open_thread(self, channel_id: str, header: str) -> str:
        """`r<the header's message id>` (`telegram_reply.start_thread`); see `channels.base`."""
        return await start_thread(self, channel_id, header)

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
        inbound = self._reader.inbound(update.update_id, message, sender, text)
        if inbound is None:
            return
        reply, bot_id = message.reply_to_message, self._reader.bot_id
        in_bot_thread = bool(reply and reply.from_user and reply.from_user.id == bot_id)
        if not self._gate.admit(
            inbound,
            from_bot=sender.is_bot,
            from_self=sender.id == bot_id,
            in_bot_thread=in_bot_thread,
        ):
            return
        place = Place(
            message.chat_id,
            int(inbound.thread_id) if inbound.thread_id else None,
            None if inbound.is_dm else message.message_id,
        )
        taken = self._taking.pop(id(update), None)
        if taken is not None and inbound.command is not None:
            taken.set_result(None)  # commands act at once and store nothing
            taken = None
        self._enqueue(Handover(inbound, TelegramResponder(self, place), taken))

    def _enqueue(self, handover: Handover) -> None:
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

    async def _submit_all(self, key: ConversationKey, inbox: asyncio.Queue[Handover]) -> None:
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

    async def ask_approval(self, place: Place, request: ApprovalRequest) -> bool:
        """Post the prompt with Approve/Deny buttons and wait for an approver."""
        bot = self.app.bot

        async def show(req: ApprovalRequest) -> PromptRef:
            text, buttons = approval_prompt(req)
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
            verdict = await self._approvals.resolve_click(
                parsed.request_id,
                str(user.id),
                user.username or user.full_name,
                parsed.allow,
                agent=self._agent,
                settle=self._settle_prompt,
                scope=parsed.scope,
            )
            answer = {
                "ok": ("Approved" if parsed.allow else "Denied", False),
                "not_approver": (self._approvals.refusal(), True),
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


__all__ = ["TelegramChannel"]
