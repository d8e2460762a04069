"""Telegram messages on their way to the agent: an update read from its JSON on its own
(`read_update`: one the library cannot read is set aside, not fatal to its batch), a
message read as an `Inbound` (commands normalised, the bot's own @mentions taken out, the
text as Markdown) and the hand-over that tells the update loop when it may confirm the
update."""

from __future__ import annotations

import asyncio
import json
import re

from telegram import Bot, Message, MessageEntity, Update, User
from telegram.constants import ChatType

from channels.inbound import telegram_markdown
from core.chat import Inbound, Responder
from core.command_table import COMMANDS
from core.records import record

_ALIASES = {"start": "help"}  # Telegram clients send /start when a user opens the bot


def update_id_of(raw: object) -> int | None:
    """The `update_id` of an update's JSON, if it has a usable one."""
    update_id = raw.get("update_id") if isinstance(raw, dict) else None
    return update_id if isinstance(update_id, int) and not isinstance(update_id, bool) else None


def raw_json(raw: object) -> str:
    """The update as JSON text again, for the operator (ASCII: a lone surrogate stays an
    escape, which any store can hold)."""
    return json.dumps(raw, sort_keys=True, default=str)


def read_update(raw: object, bot: Bot) -> Update | str:
    """One update from its JSON, or why it cannot be taken in: python-telegram-bot cannot
    parse it, or fields the adapter reads have the wrong shape (PTB checks no types)."""
    if not isinstance(raw, dict) or update_id_of(raw) is None:
        return "no integer update_id"
    try:
        update = Update.de_json(raw, bot)  # PTB copies what it parses: `raw` stays as sent
    except Exception as exc:  # PTB parses data it does not expect in many ways; none is ours
        return f"python-telegram-bot cannot parse it ({type(exc).__name__}: {exc})"
    return _misshapen(update) or update


def _misshapen(update: Update) -> str | None:
    """What is wrong with a parsed update's fields that the handlers read, if anything."""
    if (message := update.message) is not None:
        chat, sender = message.chat, message.from_user
        if chat is None or not isinstance(chat.id, int):
            return "a message without a chat"
        if message.text is not None and not isinstance(message.text, str):
            return "a message whose text is not text"
        if sender is not None and not isinstance(sender.id, int):
            return "a message whose sender has no user id"
        for entity in message.entities:
            if not (isinstance(entity.offset, int) and isinstance(entity.length, int)):
                return "a message entity without an offset and a length"
    if (query := update.callback_query) is not None:
        if query.from_user is None or not isinstance(query.from_user.id, int):
            return "a button click without a sender"
        if query.data is not None and not isinstance(query.data, str):
            return "a button click whose data is not text"
    return None


@record(frozen=True, slots=True)
class Handover:
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


@record(frozen=True, slots=True)
class MessageReader:
    """Reads messages as the bot sees them: it is `bot_id`, @`username` on Telegram."""

    bot_id: int = 0
    username: str = ""
    channel: str = "telegram"

    def inbound(self, update_id: int, message: Message, sender: User, text: str) -> Inbound | None:
        """The message as an `Inbound`, or None if it is empty or a command for another bot.
        The agent gets the text as Markdown (`channels.inbound`); `message.text` stays raw."""
        markdown = telegram_markdown(text, message.entities)
        commands = message.parse_entities([MessageEntity.BOT_COMMAND]).items()
        command = next(((e, value) for e, value in commands if e.offset == 0), None)
        if command is not None:
            name, _, target = command[1][1:].partition("@")
            if target and target.lower() != self.username.lower():
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
        # In a forum topic every message "replies" to the topic's first message: only
        # elsewhere is a reply one a person chose (to a trigger's header, say).
        reply = None if message.is_topic_message else message.reply_to_message
        return Inbound(
            channel=self.channel,
            channel_id=str(message.chat_id),
            thread_id=str(topic) if topic else "",
            user_id=str(sender.id),
            user_name=sender.username or sender.full_name,
            text=text,
            is_dm=message.chat.type == ChatType.PRIVATE,
            mentions_bot=mentioned,
            event_id=str(update_id),
            message_id=str(message.message_id),
            reply_to=str(reply.message_id) if reply is not None else "",
        )

    def _strip_mentions(self, message: Message, text: str) -> tuple[str, bool]:
        """`text` (the message as Markdown) without the bot's @mentions, and whether there
        was one. A text mention of the bot reads `@botname` in Markdown, so it goes too."""
        handle = f"@{self.username}".lower()
        mentioned = False
        for entity, value in message.parse_entities(
            [MessageEntity.MENTION, MessageEntity.TEXT_MENTION]
        ).items():
            if entity.type == MessageEntity.TEXT_MENTION:
                mentioned |= entity.user is not None and entity.user.id == self.bot_id
            elif value.lower() == handle:
                mentioned = True
        if mentioned and self.username:
            pattern = rf"@{re.escape(self.username)}\b[ \t]?"
            text = re.sub(pattern, "", text, flags=re.IGNORECASE)
        return text.strip(), mentioned
