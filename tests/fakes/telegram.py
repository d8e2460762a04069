"""A fake Telegram Bot API server for driving the real python-telegram-bot in tests.

It listens on 127.0.0.1 on a free port and answers `{url}/bot{token}/{method}` the way the
Bot API does (PTB posts form fields whose values are JSON-encoded; JSON and query strings
are accepted too)::

    async with FakeTelegram() as fake:
        app = ApplicationBuilder().token(fake.token).base_url(f"{fake.url}/bot")...
        update = fake.dm(ALICE, "hi")
        await fake.wait_for("sendMessage")

Every request is recorded as a `Call` in `fake.calls`. Messages the bot sends are kept
(`fake.messages`, `fake.texts(chat_id)`), with the checks Telegram makes: 4096 characters
after entity parsing, strict HTML for `parse_mode=HTML` ("can't parse entities"), "message
is not modified", unknown chats, messages and forum topics. Updates wait in a queue served
by `getUpdates` (long poll, confirmed by `offset`) or, once `setWebhook` was called, are
POSTed to the webhook with the `X-Telegram-Bot-Api-Secret-Token` header. `fail_next`
injects 429 (with `parameters.retry_after`), 5xx or a 400 with a chosen description;
`push_raw` delivers a malformed update and `answer_raw` a malformed answer.
Unknown methods answer 404 so gaps fail loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
from aiohttp import web

from tests.fakes.calls import Call, CallLog, Failure, FailureQueue, LogsCalls

__all__ = ["BOT", "Call", "FakeTelegram", "TgUser", "formatted"]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_TEXT = 4096
_ALLOWED_TAGS = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s[^>]*)?)>")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);")
_COMMAND_NAME = re.compile(r"^[a-z0-9_]{1,32}$")


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True, slots=True)
class TgUser:
    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        if self.username:
            data["username"] = self.username
        return data


BOT = TgUser(7000001, "Parley", "parley_bot", is_bot=True)


@dataclass
class _Pending:
    update: dict[str, Any]
    forced: bool = False  # a redelivery: sent once whatever the offset


class _ApiError(Exception):
    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


def parse_html(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Telegram's HTML parse mode: visible text and entities, or `_ApiError` 400."""
    out: list[str] = []
    entities: list[dict[str, Any]] = []
    stack: list[tuple[str, int, dict[str, Any]]] = []
    extra: dict[str, Any]
    pos = 0

    def offset_bytes(index: int) -> int:
        return len(text[:index].encode())

    def visible_len() -> int:
        return utf16_len("".join(out))

    while pos < len(text):
        ch = text[pos]
        if ch == "<":
            match = _TAG.match(text, pos)
            if match is None:
                raise _ApiError(
                    400,
                    "Bad Request: can't parse entities: Unsupported start tag at byte offset "
                    f"{offset_bytes(pos)}",
                )
            closing, name, attrs = match.group(1), match.group(2).lower(), match.group(3)
            if name not in _ALLOWED_TAGS:
                raise _ApiError(
                    400,
                    f'Bad Request: can\'t parse entities: Unsupported start tag "{name}" at byte '
                    f"offset {offset_bytes(pos)}",
                )
            if closing:
                if not stack or stack[-1][0] != name:
                    expected = f'"</{stack[-1][0]}>"' if stack else "no end tag"
                    raise _ApiError(
                        400,
                        "Bad Request: can't parse entities: Unmatched end tag at byte offset "
                        f'{offset_bytes(pos)}, expected {expected}, found "</{name}>"',
                    )
                open_name, start, extra = stack.pop()
                length = visible_len() - start
                if length:
                    entities.append(
                        {"type": _ALLOWED_TAGS[open_name], "offset": start, "length": length}
                        | extra
                    )
            else:
                extra = {}
                href = re.search(r'href\s*=\s*"([^"]*)"', attrs)
                if name == "a":
                    if href is None:
                        raise _ApiError(400, "Bad Request: can't parse entities: href missing")
                    extra["url"] = html.unescape(href.group(1))
                lang = re.search(r'class\s*=\s*"language-([^"]+)"', attrs)
                if name == "code" and lang and stack and stack[-1][0] == "pre":
                    stack[-1][2]["language"] = lang.group(1)
                stack.append((name, visible_len(), extra))
            pos = match.end()
        elif ch == "&":
            match = _ENTITY.match(text, pos)
            if match is None:
                out.append("&")
                pos += 1
            else:
                out.append(html.unescape(match.group(0)))
                pos = match.end()
        else:
            out.append(ch)
            pos += 1
    if stack:
        raise _ApiError(
            400,
            "Bad Request: can't parse entities: Can't find end tag corresponding to start tag "
            f'"{stack[-1][0]}"',
        )
    entities = [e for e in entities if e["type"] != "code" or not _inside_pre(e, entities)]
    return "".join(out), sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def formatted(html_text: str, *users: TgUser) -> tuple[str, list[dict[str, Any]]]:
    """What a client sends for a message its user formatted: the visible text and its
    entities, written here as Telegram HTML (`<b>`, `<code>`, `<pre><code
    class="language-x">`, `<a href>`…). A link to `tg://user?id=N` of one of `users` is a
    `text_mention` of that user, as when someone picks a user without a username."""
    text, entities = parse_html(html_text)
    by_id = {user.id: user for user in users}
    for entity in entities:
        url = str(entity.get("url", ""))
        if entity["type"] == "text_link" and url.startswith("tg://user?id="):
            user = by_id[int(url.removeprefix("tg://user?id="))]
            entity["type"] = "text_mention"
            entity["user"] = user.to_dict()
            del entity["url"]
    return text, entities


def _inside_pre(entity: dict[str, Any], entities: list[dict[str, Any]]) -> bool:
    return any(
        other["type"] == "pre"
        and other["offset"] <= entity["offset"]
        and entity["offset"] + entity["length"] <= other["offset"] + other["length"]
        for other in entities
    )


def _decode(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


class FakeTelegram(LogsCalls):
    """The fake Bot API. `async with FakeTelegram() as fake:`; `fake.url` is the API root.

    Each `Call` carries the status the fake answered and, on success, the result. Waits
    (`wait_for`, `wait_until`) re-check after every call and every update queued or
    delivered to the webhook."""

    def __init__(self, *, token: str = "123456:TEST-token", bot: TgUser = BOT) -> None:
        self.token = token
        self.bot = bot
        self.port = 0
        self.log = CallLog("Telegram")
        self.messages: dict[tuple[int, int], dict[str, Any]] = {}
        self.deleted: set[tuple[int, int]] = set()
        self.chats: dict[int, dict[str, Any]] = {}
        self.commands: list[dict[str, Any]] = []
        self.webhook_url = ""
        self.webhook_secret: str | None = None
        self.deliveries: list[tuple[int, int]] = []  # (update_id, webhook HTTP status)
        self.callback_answers: dict[str, dict[str, Any]] = {}
        self.drafts: dict[int, list[tuple[int, str]]] = {}  # chat → (draft_id, text) updates
        self.drafts_enabled = True  # False: a Bot API before 9.3 (404 for sendMessageDraft)
        self._pending: list[_Pending] = []
        self._failures = FailureQueue()
        self._raw_answers: dict[str, list[dict[str, Any]]] = {}
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(500)
        self._callback_ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`: PTB's `base_url` is `f"{url}/bot"`."""
        if self._runner is None:
            raise RuntimeError("FakeTelegram is not running")
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        # handler_cancellation: a long poll whose client went away must not take updates.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=0.2,
            handler_cancellation=True,
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._runner = runner
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()
        self.log.notify()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # ------------------------------------------------------------------ inspecting

    def bot_messages(self, chat_id: int) -> list[dict[str, Any]]:
        """The bot's messages in `chat_id` that still exist, oldest first."""
        return [
            msg
            for (chat, mid), msg in sorted(self.messages.items())
            if chat == chat_id
            and (chat, mid) not in self.deleted
            and msg["from"]["id"] == self.bot.id
        ]

    def texts(self, chat_id: int) -> list[str]:
        """The visible text of each of the bot's live messages in `chat_id`."""
        return [msg["text"] for msg in self.bot_messages(chat_id)]

    def fail_next(
        self,
        method: str,
        status: int,
        retry_after: int | None = None,
        times: int = 1,
        *,
        description: str | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Answer the next `times` calls of `method` (whose params match `where`) with an
        error: 429 carries `parameters.retry_after`, others `description`."""
        self._failures.add(method, Failure(status, retry_after, description, where, times))

    def clear_failures(self) -> None:
        """Forget the failures `fail_next` queued and not yet spent."""
        self._failures._queues.clear()

    # ------------------------------------------------------------------ injecting updates

    def add_chat(self, chat_id: int, *, title: str = "Team", forum: bool = False) -> None:
        """Make a group known (Telegram knows every chat the bot is in)."""
        self.chats[chat_id] = {"id": chat_id, "type": "supergroup", "title": title} | (
            {"is_forum": True} if forum else {}
        )

    def dm(
        self, user: TgUser, text: str, *, entities: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A private message from `user` to the bot."""
        chat = {"id": user.id, "type": "private", "first_name": user.first_name}
        if user.username:
            chat["username"] = user.username
        self.chats[user.id] = chat
        return self._push_message(user.id, user, text, entities or [])

    def group_message(
        self,
        chat_id: int,
        user: TgUser,
        text: str,
        *,
        mention: bool = False,
        reply_to: int | None = None,
        thread_id: int | None = None,
        entities: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A group message; `mention` prefixes `@botname`, `reply_to` replies to a message
        id in that chat, `thread_id` puts it in a forum topic; `entities` (offsets in
        `text`, see `formatted`) are its formatting."""
        if chat_id not in self.chats:
            self.add_chat(chat_id, forum=thread_id is not None)
        entities = [dict(e) for e in entities or []]
        if mention:
            handle = f"@{self.bot.username}"
            text = f"{handle} {text}"
            shift = utf16_len(handle) + 1
            for entity in entities:
                entity["offset"] += shift
            entities.insert(0, {"type": "mention", "offset": 0, "length": utf16_len(handle)})
        return self._push_message(
            chat_id, user, text, entities, reply_to=reply_to, thread_id=thread_id
        )

    def command(
        self,
        user: TgUser,
        name: str,
        args: str = "",
        *,
        chat_id: int | None = None,
        at: str | None = None,
        thread_id: int | None = None,
    ) -> dict[str, Any]:
        """`/name[@at] args` with its `bot_command` entity, in a DM or in group `chat_id`."""
        head = f"/{name}" + (f"@{at}" if at else "")
        text = f"{head} {args}".rstrip()
        entities = [{"type": "bot_command", "offset": 0, "length": utf16_len(head)}]
        if chat_id is None:
            return self.dm(user, text, entities=entities)
        if chat_id not in self.chats:
            self.add_chat(chat_id, forum=thread_id is not None)
        return self._push_message(chat_id, user, text, entities, thread_id=thread_id)

    def own_message(self, chat_id: int, text: str) -> dict[str, Any]:
        """A message from the bot itself arriving as an update (must be ignored)."""
        return self._push_message(chat_id, self.bot, text, [])

    def click(self, user: TgUser, chat_id: int, message_id: int, data: str) -> dict[str, Any]:
        """`user` presses the inline button carrying `data` under the bot's message."""
        message = self.messages[(chat_id, message_id)]
        query = {
            "id": str(next(self._callback_ids)),
            "from": user.to_dict(),
            "chat_instance": f"ci{chat_id}",
            "data": data,
            "message": message,
        }
        return self._push({"callback_query": query})

    def push_raw(self, update: dict[str, Any]) -> dict[str, Any]:
        """Deliver `update` (given an `update_id`) exactly as written, however malformed:
        what a newer Bot API, or a broken one, may send that the library cannot read."""
        return self._push(update)

    def answer_raw(self, method: str, body: dict[str, Any]) -> None:
        """Answer the next call of `method` with HTTP 200 and `body` as it stands (e.g.
        `{"ok": true}` without a `result`)."""
        self._raw_answers.setdefault(method, []).append(body)

    def redeliver(self, update: dict[str, Any]) -> dict[str, Any]:
        """Send an update again with the same `update_id`, as Telegram does when it did not
        see it confirmed (offset not advanced / webhook not answered)."""
        self._deliver(_Pending(update, forced=True))
        return update

    async def push_webhook(self, update: dict[str, Any], *, secret: str | None = None) -> int:
        """POST `update` to the registered webhook now (`secret` overrides the header)."""
        header = self.webhook_secret if secret is None else secret
        headers = {SECRET_HEADER: header} if header is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.webhook_url, json=update, headers=headers) as response,
        ):
            await response.read()
            self.deliveries.append((update["update_id"], response.status))
            self.log.notify()
            return response.status

    def _push_message(
        self,
        chat_id: int,
        user: TgUser,
        text: str,
        entities: list[dict[str, Any]],
        *,
        reply_to: int | None = None,
        thread_id: int | None = None,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": self.chats[chat_id],
            "from": user.to_dict(),
            "text": text,
        }
        if entities:
            message["entities"] = entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to is not None:
            message["reply_to_message"] = self.messages[(chat_id, reply_to)]
        self.messages[(chat_id, message["message_id"])] = message
        return self._push({"message": message})

    def _push(self, update: dict[str, Any]) -> dict[str, Any]:
        update = {"update_id": next(self._update_ids)} | update
        self._deliver(_Pending(update))
        return update

    def _deliver(self, pending: _Pending) -> None:
        if self.webhook_url:
            task = asyncio.get_running_loop().create_task(self.push_webhook(pending.update))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._pending.append(pending)
            self.log.notify()

    # ------------------------------------------------------------------ HTTP

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await self._params(request)
        headers = dict(request.headers)
        if request.match_info["token"] != self.token:
            return self._record(method, params, headers, 401, "Unauthorized")
        handler = getattr(self, f"_api_{method}", None)
        if handler is None:
            return self._record(method, params, headers, 404, "Not Found")
        failure = self._failures.take(method, params)
        if failure is not None:
            return self._record_failure(method, params, headers, failure)
        if raw_answers := self._raw_answers.get(method):
            body = raw_answers.pop(0)
            self.log.record(method, params, headers, 200, body.get("result"))
            return web.json_response(body)
        try:
            result = await handler(params)
        except _ApiError as exc:
            return self._record(method, params, headers, exc.status, exc.description)
        self.log.record(method, params, headers, 200, result)
        return web.json_response({"ok": True, "result": result})

    @staticmethod
    async def _params(request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = {k: _decode(v) for k, v in request.query.items()}
        if request.content_type == "application/json":
            body = await request.json() if request.can_read_body else {}
            params.update(body or {})
        elif request.can_read_body:
            form = await request.post()
            params.update({k: _decode(v) for k, v in form.items() if isinstance(v, str)})
        return params

    def _record_failure(
        self, method: str, params: dict[str, Any], headers: dict[str, str], failure: Failure
    ) -> web.Response:
        if failure.status == 429:
            retry = failure.retry_after if failure.retry_after is not None else 1
            self.log.record(method, params, headers, 429)
            body = {
                "ok": False,
                "error_code": 429,
                "description": f"Too Many Requests: retry after {retry}",
                "parameters": {"retry_after": retry},
            }
            return web.json_response(body, status=429)
        description = failure.detail or (
            "Internal Server Error" if failure.status >= 500 else "Bad Request: injected"
        )
        return self._record(method, params, headers, failure.status, description)

    def _record(
        self,
        method: str,
        params: dict[str, Any],
        headers: dict[str, str],
        status: int,
        description: str,
    ) -> web.Response:
        self.log.record(method, params, headers, status)
        body = {"ok": False, "error_code": status, "description": description}
        return web.json_response(body, status=status)

    # ------------------------------------------------------------------ API methods

    async def _api_getMe(self, params: dict[str, Any]) -> Any:
        return self.bot.to_dict() | {
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    async def _api_setWebhook(self, params: dict[str, Any]) -> Any:
        if not str(params.get("url", "")).startswith(("http://", "https://")):
            raise _ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided")
        self.webhook_url = params["url"]
        secret = params.get("secret_token")
        self.webhook_secret = None if secret is None else str(secret)
        pending, self._pending = self._pending, []
        for item in pending:
            self._deliver(item)
        return True

    async def _api_deleteWebhook(self, params: dict[str, Any]) -> Any:
        self.webhook_url, self.webhook_secret = "", None
        if params.get("drop_pending_updates"):
            self._pending.clear()
        return True

    async def _api_getWebhookInfo(self, params: dict[str, Any]) -> Any:
        return {
            "url": self.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": len(self._pending),
        }

    async def _api_getUpdates(self, params: dict[str, Any]) -> Any:
        if self.webhook_url:
            raise _ApiError(409, "Conflict: can't use getUpdates method while webhook is active")
        offset = int(params.get("offset") or 0)
        timeout = float(params.get("timeout") or 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self._pending = [
                p for p in self._pending if p.forced or p.update["update_id"] >= offset
            ]
            if self._pending or self._closing.is_set() or loop.time() >= deadline:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self.log.changed()
        forced = [p for p in self._pending if p.forced]
        normal = sorted(
            (p for p in self._pending if not p.forced), key=lambda p: p.update["update_id"]
        )
        self._pending = normal  # kept until confirmed by a higher offset
        return [p.update for p in forced + normal]

    def _chat(self, params: dict[str, Any]) -> dict[str, Any]:
        chat = self.chats.get(_int(params.get("chat_id")))
        if chat is None:
            raise _ApiError(400, "Bad Request: chat not found")
        return chat

    def _render(self, params: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        raw = str(params.get("text", ""))
        mode = str(params.get("parse_mode") or "").upper()
        if mode == "HTML":
            text, entities = parse_html(raw)
        elif mode:
            raise _ApiError(400, f"Bad Request: unsupported parse_mode {mode}")
        else:
            text, entities = raw, list(params.get("entities") or [])
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        return text, entities

    async def _api_sendMessage(self, params: dict[str, Any]) -> Any:
        chat = self._chat(params)
        text, entities = self._render(params)
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": chat,
            "from": self.bot.to_dict(),
            "text": text,
        }
        if entities:
            message["entities"] = entities
        thread = params.get("message_thread_id")
        if thread is not None:
            if not chat.get("is_forum"):
                raise _ApiError(400, "Bad Request: message thread not found")
            message["message_thread_id"] = int(thread)
            message["is_topic_message"] = True
        reply = params.get("reply_parameters")
        if isinstance(reply, dict):
            target = self.messages.get((chat["id"], int(reply["message_id"])))
            if target is None and not reply.get("allow_sending_without_reply"):
                raise _ApiError(400, "Bad Request: message to be replied not found")
            if target is not None:
                message["reply_to_message"] = target
        if params.get("reply_markup"):
            message["reply_markup"] = params["reply_markup"]
        self.messages[(chat["id"], message["message_id"])] = message
        return message

    def _own_message(self, params: dict[str, Any], what: str) -> dict[str, Any]:
        chat = self._chat(params)
        key = (chat["id"], _int(params.get("message_id")))
        message = self.messages.get(key)
        if message is None or key in self.deleted:
            raise _ApiError(400, f"Bad Request: message to {what} not found")
        if message["from"]["id"] != self.bot.id:
            raise _ApiError(400, f"Bad Request: message can't be {what}ed")
        return message

    async def _api_editMessageText(self, params: dict[str, Any]) -> Any:
        message = self._own_message(params, "edit")
        text, entities = self._render(params)
        markup = params.get("reply_markup") or None
        if (
            text == message["text"]
            and entities == message.get("entities", [])
            and markup == message.get("reply_markup")
        ):
            raise _ApiError(
                400,
                "Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message",
            )
        message["text"] = text
        message["edit_date"] = int(time.time())
        message.pop("entities", None)
        message.pop("reply_markup", None)
        if entities:
            message["entities"] = entities
        if markup:
            message["reply_markup"] = markup
        return message

    async def _api_deleteMessage(self, params: dict[str, Any]) -> Any:
        message = self._own_message(params, "delete")
        self.deleted.add((message["chat"]["id"], message["message_id"]))
        return True

    async def _api_sendMessageDraft(self, params: dict[str, Any]) -> Any:
        """Bot API 9.3 `sendMessageDraft`: a private chat only; `draft_id` non-zero;
        `text` 0-4096 characters (empty: the "Thinking…" placeholder). Each update is
        kept in `drafts[chat_id]` as (draft_id, text)."""
        if not self.drafts_enabled:
            raise _ApiError(404, "Not Found")
        chat = self._chat(params)
        if chat.get("type") != "private":
            raise _ApiError(400, "Bad Request: TEXTDRAFT_PEER_INVALID")
        draft_id = _int(params.get("draft_id"))
        if draft_id == 0:
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if utf16_len(text) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: text is too long")
        self.drafts.setdefault(chat["id"], []).append((draft_id, text))
        return True

    async def _api_sendChatAction(self, params: dict[str, Any]) -> Any:
        self._chat(params)
        if params.get("action") not in {"typing", "upload_document", "upload_photo"}:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        return True

    async def _api_answerCallbackQuery(self, params: dict[str, Any]) -> Any:
        query_id = str(params.get("callback_query_id", ""))
        if not query_id:
            raise _ApiError(400, "Bad Request: query is too old or query ID is invalid")
        self.callback_answers[query_id] = params
        return True

    async def _api_setMyCommands(self, params: dict[str, Any]) -> Any:
        commands = params.get("commands")
        if not isinstance(commands, list) or len(commands) > 100:
            raise _ApiError(400, "Bad Request: commands must be a list of at most 100")
        for command in commands:
            name, description = command.get("command", ""), command.get("description", "")
            if not _COMMAND_NAME.match(name) or not 1 <= len(description) <= 256:
                raise _ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
        self.commands = commands
        return True

    async def _api_getMyCommands(self, params: dict[str, Any]) -> Any:
        return self.commands


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _ApiError(400, "Bad Request: chat not found") from None
