"""A fake Slack for tests: Web API, Socket Mode websocket and `response_url`, on 127.0.0.1.

The real slack_sdk / slack-bolt talk to it unchanged (PLATFORMS.md, Slack)::

    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
        ...                            # the adapter connects over Socket Mode
        await fake.connected()
        envelope = await fake.dm("hello")
        await fake.wait_for("chat.update", count=1)

Every Web API call is recorded as a `Call` (`fake.calls`); unknown methods answer 404 so
gaps fail loudly. Bot posts are kept as `Posted` messages (text after every edit), so a test
can check what a reader would finally see. Inbound events go over the Socket Mode websocket,
or, when `fake.http_target` is set, are POSTed signed to the adapter's HTTP endpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from aiohttp import web

from tests.fakes.calls import Call, CallLog, Failure, FailureQueue, LogsCalls
from tests.fakes.slack_ai import SlackAI

__all__ = [
    "BOT_ID",
    "BOT_USER_ID",
    "Call",
    "Envelope",
    "FakeSlack",
    "Posted",
    "as_typed",
    "sign",
]

BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
TEAM_ID = "T0FAKE"
APP_ID = "A0FAKE"
MAX_TEXT_BYTES = 4000  # chat.update refuses longer text with msg_too_long (PLATFORMS.md)
APP_TOKEN_METHODS = {"apps.connections.open"}


# Slack's markup tokens: user, channel and special mentions, links (`<url|label>`).
_MARKUP = re.compile(
    r"(<(?:[@#][A-Z0-9]+|![a-z]+(?:\^[^|<>\s]*)?|(?:https?|mailto|tel):[^|<>\s]+)(?:\|[^<>]*)?>)"
)


def as_typed(text: str) -> str:
    """Message text as Slack delivers what a user typed: `&`, `<`, `>` escaped, except in
    Slack's own tokens (`<@U…>`, `<#C…|name>`, `<!here>`, `<https://…|label>`), which the
    client writes for mentions and links."""
    parts = _MARKUP.split(text)
    return "".join(
        part if i % 2 else part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for i, part in enumerate(parts)
    )


def sign(secret: str, timestamp: str, body: str | bytes) -> str:
    """The `X-Slack-Signature` value Slack sends for `body` at `timestamp` (over the raw
    bytes of the body, whatever they are)."""
    base = f"v0:{timestamp}:".encode() + (body if isinstance(body, bytes) else body.encode())
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass
class Envelope:
    """One inbound delivery (Socket Mode envelope or signed HTTP request)."""

    envelope_id: str
    type: str  # events_api | slash_commands | interactive
    payload: dict[str, Any]
    retry_attempt: int = 0
    http_status: int | None = None  # HTTP delivery only: the adapter's answer
    http_body: str = ""

    @property
    def ts(self) -> str:
        """The message ts of an `events_api` envelope."""
        return str(self.payload["event"]["ts"])


@dataclass
class Posted:
    """A message the bot posted; `texts` holds the text after the post and every edit."""

    channel: str
    ts: str
    thread_ts: str | None
    texts: list[str]
    blocks: list[dict[str, Any]] | None = None
    deleted: bool = False
    first_blocks: list[dict[str, Any]] | None = None
    streaming: bool = False  # a native stream still open (chat.startStream)
    native: bool = False  # posted by chat.startStream (Markdown, not mrkdwn)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # task chunks, in order

    def __post_init__(self) -> None:
        self.first_blocks = self.blocks

    @property
    def text(self) -> str:
        return self.texts[-1]


@dataclass
class _Sockets:
    open: list[web.WebSocketResponse] = field(default_factory=list)
    hellos: int = 0


class FakeSlack(SlackAI, LogsCalls):
    """Fake Slack on a free port. Tokens are checked: bot methods want `bot_token`,
    `apps.connections.open` wants `app_token`. Calls (`fake.calls`) are Web API methods,
    `response_url` posts and `socket.ack`s."""

    def __init__(
        self, *, bot_token: str = "xoxb-fake-bot-token", app_token: str = "xapp-fake-app-token"
    ) -> None:
        self.bot_token, self.app_token = bot_token, app_token
        self.log = CallLog("Slack")
        self.envelopes: list[Envelope] = []
        self.acks: dict[str, dict[str, Any]] = {}
        self.messages: dict[tuple[str, str], Posted] = {}
        self.reactions: set[tuple[str, str, str]] = set()
        self.users: dict[str, str] = {"U1": "alice", "U2": "bob", "U3": "carol", "U9": "mallory"}
        self.not_in_channel: set[str] = set()
        self.usergroups: dict[str, list[str]] = {}  # user group id → its members' ids
        self.http_target: tuple[str, str] | None = None  # (events URL, signing secret)
        self.delays: dict[str, float] = {}  # method → seconds it is answered late
        # method → awaited once a call has taken effect, before it is answered (a test
        # can kill the caller in between: the message is in the chat, the caller never
        # heard so)
        self.before_answer: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {}
        self._failures = FailureQueue()
        self._sockets = _Sockets()
        self.init_ai()
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._web_api)
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/response/{id}", self._response_url)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for ws in list(self._sockets.open):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        """The Web API root to configure as `SlackConfig.base_url`."""
        return f"http://127.0.0.1:{self.port}/api/"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- waiting and inspecting -----------------------------------------------------------

    async def connected(self, timeout: float = 10.0, *, sessions: int = 1) -> None:
        """Wait until a Socket Mode client is connected and greeted (`sessions`: the how
        many-th connection, e.g. 2 after the client's process was restarted)."""
        await self.until(
            lambda: self._sockets.open and self._sockets.hellos >= sessions, timeout, "socket"
        )

    async def wait_ack(self, envelope: Envelope, timeout: float = 10.0) -> dict[str, Any]:
        """The client's ack of `envelope` (Socket Mode)."""
        ack: dict[str, Any] = await self.until(
            lambda: self.acks.get(envelope.envelope_id), timeout, f"ack {envelope.envelope_id}"
        )
        return ack

    def thread(self, channel: str, thread_ts: str | None) -> list[Posted]:
        """The bot's live (not deleted) messages in one thread (or top level), oldest first."""
        return sorted(
            (
                m
                for m in self.messages.values()
                if m.channel == channel and m.thread_ts == thread_ts and not m.deleted
            ),
            key=lambda m: float(m.ts),
        )

    def live_messages(self) -> Iterator[Posted]:
        return (m for m in self.messages.values() if not m.deleted)

    # ---- fault injection -------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        status: int,
        retry_after: float | None = None,
        times: int = 1,
        *,
        error: str | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Answer the next `times` calls of `method` (whose params match `where`) with an
        error: 429 (ratelimited, with a `Retry-After` header), 5xx (an HTML error page), or
        200 with `{"ok": false, "error"}` when `error` is given."""
        self._failures.add(method, Failure(status, retry_after, error, where, times))

    def fail_no_more(self) -> None:
        """Forget the failures not served yet."""
        self._failures = FailureQueue()

    # ---- the Web API ------------------------------------------------------------------------

    def _next_ts(self) -> str:
        n = next(self._ts)
        return f"{1_700_000_000 + n}.{n:06d}"

    @staticmethod
    async def _params(request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                params.update(body)
        elif request.can_read_body:
            for key, value in (await request.post()).items():
                params[key] = value if isinstance(value, str) else str(value)
        for key in ("blocks", "attachments"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        return params

    async def _web_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        self.log.record(method, params, dict(request.headers))
        handler = getattr(self, "_api_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"}, status=404)
        want = self.app_token if method in APP_TOKEN_METHODS else self.bot_token
        if request.headers.get("Authorization") != f"Bearer {want}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if delay := self.delays.get(method):
            await asyncio.sleep(delay)  # a slow Slack, as seen by the client
        if failure := self._failures.take(method, params):
            return _fault_response(failure)
        result: dict[str, Any] = handler(params)
        if (hook := self.before_answer.get(method)) is not None:
            await hook(params)
        return web.json_response(result)

    def _api_auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake.slack.com/",
            "team": "Fake Team",
            "user": "parley",
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _api_apps_connections_open(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4()}"}

    def _api_users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user = str(params.get("user", ""))
        if user not in self.users:
            return {"ok": False, "error": "user_not_found"}
        name = self.users[user]
        profile = {"display_name": name, "real_name": name.title()}
        return {"ok": True, "user": {"id": user, "name": name, "profile": profile}}

    def _api_usergroups_list(self, params: dict[str, Any]) -> dict[str, Any]:
        """Every user group, with its members when `include_users` is true."""
        with_users = str(params.get("include_users", "")).lower() in ("1", "true")
        groups = [
            {"id": gid, "handle": gid.lower(), "name": gid, "date_delete": 0}
            | ({"users": list(users), "user_count": len(users)} if with_users else {})
            for gid, users in self.usergroups.items()
        ]
        return {"ok": True, "usergroups": groups}

    def _text_problem(self, params: dict[str, Any]) -> str | None:
        channel, text = str(params.get("channel", "")), params.get("text")
        if not channel:
            return "channel_not_found"
        if channel in self.not_in_channel:
            return "not_in_channel"
        if not text and not params.get("blocks"):
            return "no_text"
        if text and len(str(text).encode()) > MAX_TEXT_BYTES:
            return "msg_too_long"
        return None

    def _api_chat_postMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        if problem := self._text_problem(params):
            return {"ok": False, "error": problem}
        channel, ts = str(params["channel"]), self._next_ts()
        thread_ts = params.get("thread_ts") or None
        text = str(params.get("text") or "")
        self.messages[(channel, ts)] = Posted(channel, ts, thread_ts, [text], params.get("blocks"))
        message = {"type": "message", "user": BOT_USER_ID, "bot_id": BOT_ID, "text": text}
        return {"ok": True, "channel": channel, "ts": ts, "message": message | {"ts": ts}}

    def _new_posted(self, channel: str, ts: str, thread_ts: str | None, text: str) -> Posted:
        return Posted(channel, ts, thread_ts, [text])

    def _api_chat_update(self, params: dict[str, Any]) -> dict[str, Any]:
        posted = self.messages.get((str(params.get("channel")), str(params.get("ts"))))
        if posted is None or posted.deleted:
            return {"ok": False, "error": "message_not_found"}
        if posted.streaming:
            return {"ok": False, "error": "cant_update_message"}
        if problem := self._text_problem(params):
            return {"ok": False, "error": problem}
        posted.texts.append(str(params.get("text") or ""))
        if "blocks" in params:
            posted.blocks = params["blocks"] or None
        return {"ok": True, "channel": posted.channel, "ts": posted.ts, "text": posted.text}

    def _api_chat_delete(self, params: dict[str, Any]) -> dict[str, Any]:
        posted = self.messages.get((str(params.get("channel")), str(params.get("ts"))))
        if posted is None or posted.deleted:
            return {"ok": False, "error": "message_not_found"}
        posted.deleted = True
        return {"ok": True, "channel": posted.channel, "ts": posted.ts}

    def _api_chat_postEphemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        if not params.get("user"):
            return {"ok": False, "error": "user_not_found"}
        if problem := self._text_problem(params):
            return {"ok": False, "error": problem}
        return {"ok": True, "message_ts": self._next_ts()}

    def _api_reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        key = (str(params.get("channel")), str(params.get("timestamp")), str(params.get("name")))
        if key in self.reactions:
            return {"ok": False, "error": "already_reacted"}
        self.reactions.add(key)
        return {"ok": True}

    async def _response_url(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.log.record("response_url", body | {"id": request.match_info["id"]}, {})
        return web.Response(text="ok")

    # ---- Socket Mode ----------------------------------------------------------------------

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.open.append(ws)
        hello = {"type": "hello", "num_connections": 1, "connection_info": {"app_id": APP_ID}}
        await ws.send_json(hello)
        self._sockets.hellos += 1
        self.log.notify()
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if isinstance(data, dict) and "envelope_id" in data:
                    self.acks[data["envelope_id"]] = data
                    self.log.record("socket.ack", data, {})
        finally:
            self._sockets.open.remove(ws)
            self.log.notify()
        return ws

    async def deliver(
        self, type_: str, payload: dict[str, Any], retry_attempt: int = 0
    ) -> Envelope:
        """Send one envelope over the socket, or POST it signed when `http_target` is set."""
        envelope = Envelope(str(uuid.uuid4()), type_, payload, retry_attempt)
        self.envelopes.append(envelope)
        if self.http_target is not None:
            envelope.http_status, envelope.http_body = await self.post_http(envelope)
            return envelope
        await self.connected()
        await self._sockets.open[-1].send_json(
            {
                "envelope_id": envelope.envelope_id,
                "type": type_,
                "payload": payload,
                "accepts_response_payload": type_ != "events_api",
                "retry_attempt": retry_attempt,
                "retry_reason": "timeout" if retry_attempt else "",
            }
        )
        return envelope

    async def redeliver(self, envelope: Envelope) -> Envelope:
        """Deliver the same payload again, as Slack does when an ack is late."""
        return await self.deliver(envelope.type, envelope.payload, envelope.retry_attempt + 1)

    # ---- HTTP Events API --------------------------------------------------------------------

    async def post_http(
        self,
        envelope: Envelope,
        *,
        timestamp: int | None = None,
        signature: str | None = None,
    ) -> tuple[int, str]:
        """POST `envelope` to `http_target` the way Slack does; returns (status, body)."""
        assert self.http_target is not None, "set fake.http_target = (url, signing_secret)"
        url, secret = self.http_target
        if envelope.type == "events_api":
            body, ctype = json.dumps(envelope.payload), "application/json"
        elif envelope.type == "slash_commands":
            body, ctype = (
                urllib.parse.urlencode(envelope.payload),
                "application/x-www-form-urlencoded",
            )
        else:
            body = urllib.parse.urlencode({"payload": json.dumps(envelope.payload)})
            ctype = "application/x-www-form-urlencoded"
        ts = str(int(time.time()) if timestamp is None else timestamp)
        headers = {
            "Content-Type": ctype,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": signature or sign(secret, ts, body),
        }
        if envelope.retry_attempt:
            headers["X-Slack-Retry-Num"] = str(envelope.retry_attempt)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body.encode(), headers=headers) as resp,
        ):
            return resp.status, await resp.text()

    async def post_raw(self, body: bytes, content_type: str) -> tuple[int, str]:
        """POST `body` as it stands to `http_target`, signed the documented way (HMAC-SHA256
        of `v0:<timestamp>:<raw body>`); returns (status, body)."""
        assert self.http_target is not None, "set fake.http_target = (url, signing_secret)"
        url, secret = self.http_target
        ts = str(int(time.time()))
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sign(secret, ts, body),
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as resp,
        ):
            return resp.status, await resp.text()

    # ---- inbound helpers ------------------------------------------------------------------

    def _event_payload(self, event: dict[str, Any]) -> dict[str, Any]:
        return {
            "token": "verification-token",
            "team_id": TEAM_ID,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{next(self._ids):08d}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
        }

    def _message(
        self, text: str, channel: str, channel_type: str, thread_ts: str | None, **extra: Any
    ) -> dict[str, Any]:
        ts = self._next_ts()
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "channel_type": channel_type,
            "text": as_typed(text),
            "ts": ts,
            "event_ts": ts,
            "team": TEAM_ID,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
            # Slack names who posted a reply's parent (a thread under one of the bot's posts)
            parent = self.messages.get((channel, thread_ts))
            if parent is not None:
                event["parent_user_id"] = BOT_USER_ID
        return event | extra

    async def send_event(self, event: dict[str, Any]) -> Envelope:
        return await self.deliver("events_api", self._event_payload(event))

    async def dm(
        self, text: str, *, user: str = "U1", channel: str = "D1", thread_ts: str | None = None
    ) -> Envelope:
        """A direct message to the bot."""
        return await self.send_event(self._message(text, channel, "im", thread_ts, user=user))

    async def mention(
        self,
        text: str,
        *,
        user: str = "U1",
        channel: str = "C1",
        thread_ts: str | None = None,
        also_message: bool = True,
    ) -> Envelope:
        """`<@bot> text` in a channel: Slack sends an `app_mention` and (with the
        message.channels subscription) a `message` event for the same ts."""
        message = self._message(
            f"<@{BOT_USER_ID}> {text}", channel, "channel", thread_ts, user=user
        )
        mention = {k: v for k, v in message.items() if k != "channel_type"} | {
            "type": "app_mention"
        }
        first = await self.send_event(mention)
        if also_message:
            await self.send_event(message)
        return first

    async def channel_message(
        self, text: str, *, user: str = "U1", channel: str = "C1", thread_ts: str | None = None
    ) -> Envelope:
        """A plain channel message (no mention), e.g. a follow-up in a thread."""
        return await self.send_event(self._message(text, channel, "channel", thread_ts, user=user))

    async def bot_message(
        self,
        text: str,
        *,
        channel: str = "C1",
        bot_id: str = "B0OTHER",
        thread_ts: str | None = None,
        legacy: bool = False,
    ) -> Envelope:
        """Another app's message: a bot user with `bot_id`, or (legacy) subtype bot_message."""
        if legacy:
            extra: dict[str, Any] = {"subtype": "bot_message", "bot_id": bot_id, "username": "x"}
        else:
            extra = {"user": "U0OTHERBOT", "bot_id": bot_id, "app_id": "A0OTHER"}
        return await self.send_event(self._message(text, channel, "channel", thread_ts, **extra))

    async def own_message(
        self, text: str, *, channel: str = "C1", thread_ts: str | None = None
    ) -> Envelope:
        """The bot's own post coming back as an event."""
        extra = {"user": BOT_USER_ID, "bot_id": BOT_ID, "app_id": APP_ID}
        return await self.send_event(self._message(text, channel, "channel", thread_ts, **extra))

    async def slash(
        self, command: str, text: str = "", *, user: str = "U1", channel: str = "D1"
    ) -> Envelope:
        """A slash command invocation (`/parley compact` or `/stop`)."""
        payload = {
            "token": "verification-token",
            "team_id": TEAM_ID,
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user,
            "user_name": self.users.get(user, user),
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "is_enterprise_install": "false",
            "response_url": f"{self.root}/response/{next(self._ids)}",
            "trigger_id": f"trigger-{next(self._ids)}",
        }
        return await self.deliver("slash_commands", payload)

    async def click(
        self, channel: str, ts: str, action_id: str, *, user: str = "U1", stale: bool = False
    ) -> Envelope:
        """A user presses the button `action_id` on the bot's message (channel, ts);
        `stale`: on the message as first posted (a client that missed the edit)."""
        posted = self.messages[(channel, ts)]
        button = next(
            element
            for block in (posted.first_blocks if stale else posted.blocks) or []
            if block.get("type") == "actions"
            for element in block["elements"]
            if element.get("action_id") == action_id
        )
        name = self.users.get(user, user)
        payload = {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": TEAM_ID},
            "api_app_id": APP_ID,
            "token": "verification-token",
            "container": {
                "type": "message",
                "message_ts": ts,
                "channel_id": channel,
                "is_ephemeral": False,
            },
            "trigger_id": f"trigger-{next(self._ids)}",
            "team": {"id": TEAM_ID, "domain": "fake"},
            "channel": {"id": channel, "name": "general"},
            "message": {
                "type": "message",
                "user": BOT_USER_ID,
                "bot_id": BOT_ID,
                "ts": ts,
                "text": posted.text,
                "blocks": posted.blocks,
            },
            "response_url": f"{self.root}/response/{next(self._ids)}",
            "actions": [
                {
                    "action_id": button["action_id"],
                    "block_id": "approval",
                    "text": button.get("text"),
                    "value": button.get("value", ""),
                    "type": "button",
                    "action_ts": str(time.time()),
                }
            ],
        }
        return await self.deliver("interactive", payload)


def _fault_response(fault: Failure) -> web.Response:
    if fault.detail is not None:
        return web.json_response({"ok": False, "error": fault.detail}, status=fault.status)
    if fault.status == 429:
        seconds = fault.retry_after or 1
        value = str(int(seconds)) if float(seconds).is_integer() else str(seconds)
        return web.json_response(
            {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": value}
        )
    return web.Response(
        status=fault.status,
        text="<html><body>Service Unavailable</body></html>",
        content_type="text/html",
    )
