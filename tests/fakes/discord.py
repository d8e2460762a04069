"""A fake Discord: the REST API (v10) and the gateway, on 127.0.0.1, for discord.py 2.x.

One guild with a text channel and two threads (the bot is a member of one), a DM channel
and a few users. Every REST call and every gateway op the client sends is recorded as a
`Call`, so tests wait on conditions instead of sleeping::

    async with FakeDiscord() as fake:
        # DiscordConfig(api_base_url=fake.url, gateway_url=fake.gateway_url, ...)
        await fake.dm("hello")
        posts = await fake.wait_for("create_message")

Method names (`Call.method`): REST calls use the names below; gateway ops are
`gateway.connect`, `gateway.identify`, `gateway.resume`, `gateway.heartbeat`.

    get_current_user          GET    /users/@me
    get_application           GET    /oauth2/applications/@me
    get_gateway(_bot)         GET    /gateway(/bot)
    bulk_overwrite_commands   PUT    /applications/{app}/commands
    create_dm                 POST   /users/@me/channels
    create_message            POST   /channels/{channel_id}/messages
    edit_message              PATCH  /channels/{channel_id}/messages/{message_id}
    delete_message            DELETE /channels/{channel_id}/messages/{message_id}
    trigger_typing            POST   /channels/{channel_id}/typing
    start_thread              POST   /channels/{channel_id}/messages/{message_id}/threads
    interaction_callback      POST   /interactions/{interaction_id}/{token}/callback
    create_followup           POST   /webhooks/{app}/{token}
    edit_followup             PATCH  /webhooks/{app}/{token}/messages/{message_id}
    delete_followup           DELETE /webhooks/{app}/{token}/messages/{message_id}

Unknown routes answer 404. The fake is strict where discord.py or Discord are: bodies
are `Content-Type: application/json` exactly; messages over 2,000 characters or empty
are refused (400, code 50035 / 50006); an interaction is acknowledged once (40060); a
thread starts once per message (160004), on a guild text channel's message only (50024);
guild message content is blanked unless IDENTIFY asked for the MESSAGE_CONTENT intent.
`fail_next(method, 429, retry_after)` answers as Discord does (`Via` header, body
`{"retry_after", "global": false}`): discord.py sleeps through it when `retry_after` is
under its cap. For 5xx prefer 503: discord.py retries 500/502/504 itself with real
sleeps of 1, 3, 5… seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import WSMsgType, web

from core.clock import Clock
from tests.fakes.calls import Call, CallLog, Failure, FailureQueue, LogsCalls
from tests.fakes.clock import FakeClock

__all__ = [
    "APP_ID",
    "BOT",
    "BOT_ID",
    "BOT_THREAD_ID",
    "CAROL",
    "CHANNEL_ID",
    "COMMANDS_PATH",
    "DM_CHANNEL_ID",
    "GUILD_ID",
    "INTENTS_NEEDED",
    "ONCALL_ROLE_ID",
    "OTHER_BOT",
    "OTHER_THREAD_ID",
    "STRANGER",
    "TOKEN",
    "USER",
    "USERS",
    "Call",
    "FakeDiscord",
    "User",
]

TOKEN = "fake-discord-token"
APP_ID = "900000000000000001"
BOT_ID = APP_ID  # a bot user shares its application's id
GUILD_ID = "910000000000000001"
CHANNEL_ID = "920000000000000001"
BOT_THREAD_ID = "920000000000000002"  # a thread the bot is a member of
OTHER_THREAD_ID = "920000000000000003"  # a thread the bot has not joined
DM_CHANNEL_ID = "930000000000000001"
COMMANDS_PATH = f"/applications/{APP_ID}/commands"
MESSAGE_LIMIT = 2000
EPHEMERAL = 1 << 6
# GUILDS | GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT
INTENTS_NEEDED = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15)
MESSAGE_CONTENT_INTENT = 1 << 15
TIMESTAMP = "2025-01-01T00:00:00.000000+00:00"


@dataclass(frozen=True)
class User:
    id: str
    name: str
    bot: bool = False
    nick: str | None = None  # the member's nickname in the guild
    roles: tuple[str, ...] = ()  # the member's guild role ids

    def payload(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "username": self.name,
            "global_name": self.name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
        }

    def member(self) -> dict[str, Any]:
        data = {
            "user": self.payload(),
            "roles": list(self.roles),
            "joined_at": TIMESTAMP,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "permissions": "2147483647",
        }
        return data | ({"nick": self.nick} if self.nick else {})


BOT = User(BOT_ID, "parley", bot=True)
USER = User("940000000000000001", "alice")
STRANGER = User("940000000000000002", "mallory")
OTHER_BOT = User("940000000000000003", "otherbot", bot=True)
CAROL = User("940000000000000004", "carol", nick="Carol (on call)")  # not a bot user
ONCALL_ROLE_ID = "950000000000000001"  # the guild's role "oncall"
USERS = {user.id: user for user in (BOT, USER, STRANGER, OTHER_BOT, CAROL)}
_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")


@dataclass
class _Channel:
    id: str
    guild_id: str | None
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # discord.py parses JSON only when Content-Type is exactly application/json
    # (aiohttp's json_response would add "; charset=utf-8").
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _without_user(member: dict[str, Any]) -> dict[str, Any]:
    """Member data as nested in a message (its user is the author or the mention itself)."""
    return {k: v for k, v in member.items() if k != "user"}


def _error(status: int, code: int, message: str) -> web.Response:
    return _json({"message": message, "code": code}, status)


_THREAD_IDS = (BOT_THREAD_ID, OTHER_THREAD_ID)


def _thread_data(
    tid: str, name: str, owner_id: str, *, parent_id: str = CHANNEL_ID, joined: bool
) -> dict[str, Any]:
    """A public thread as Discord describes it (a channel of type 11); `joined`: with the
    bot's thread member."""
    data: dict[str, Any] = {
        "id": tid,
        "guild_id": GUILD_ID,
        "parent_id": parent_id,
        "owner_id": owner_id,
        "name": name,
        "type": 11,
        "message_count": 1,
        "member_count": 2,
        "rate_limit_per_user": 0,
        "thread_metadata": {
            "archived": False,
            "auto_archive_duration": 1440,
            "archive_timestamp": TIMESTAMP,
            "locked": False,
        },
    }
    if joined:
        data["member"] = {"id": tid, "user_id": BOT_ID, "join_timestamp": TIMESTAMP, "flags": 0}
    return data


class FakeDiscord(LogsCalls):
    """A fake Discord REST API + gateway. `url` is the REST root (`…/api/v10`). A REST
    call's `params` merge path parameters, query and JSON body."""

    def __init__(
        self, *, host: str = "127.0.0.1", heartbeat_ms: int = 41250, clock: Clock | None = None
    ) -> None:
        self.host = host
        self.log = CallLog("Discord", clock=clock)
        self.network_jitter = 0.0  # seconds a request may take to arrive (fake clock only)
        self._jitter = random.Random(7)
        self.failed: list[Call] = []  # calls answered with an injected failure
        self.port = 0
        self.heartbeat_ms = heartbeat_ms
        self.identify_intents: int | None = None
        self.session_id = "fake-session-1"
        self.commands: list[dict[str, Any]] = []
        self.channels = {
            cid: _Channel(cid, GUILD_ID) for cid in (CHANNEL_ID, BOT_THREAD_ID, OTHER_THREAD_ID)
        }
        self.channels[DM_CHANNEL_ID] = _Channel(DM_CHANNEL_ID, None)
        self.threads: dict[str, dict[str, Any]] = {}  # started by the bot, by id
        self.interactions: dict[str, dict[str, Any]] = {}
        self.ephemeral: list[dict[str, Any]] = []  # messages only their recipient sees
        self._ids = itertools.count(1_300_000_000_000_000_001)
        self._seq = 0
        self._failures = FailureQueue()
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self._ws: web.WebSocketResponse | None = None
        self._sessions: set[web.WebSocketResponse] = set()  # identified or resumed, still open
        self.most_sessions = 0  # the most sessions open at once
        self._send_lock = asyncio.Lock()
        self._identified = asyncio.Event()
        self._replay: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lifecycle

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """What goes into `DiscordConfig.api_base_url`."""
        return f"{self.root}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://{self.host}:{self.port}/gateway"

    @property
    def resume_gateway_url(self) -> str:
        return f"ws://{self.host}:{self.port}/resume"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/resume", self._gateway)
        app.router.add_route("*", "/api/v10/{tail:.*}", self._rest)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ clock and failures

    @property
    def clock(self) -> Clock | None:
        """Stamps `Call.at` if set (a `core.clock.Clock`); else `time.monotonic`."""
        return self.log.clock

    @clock.setter
    def clock(self, clock: Clock | None) -> None:
        self.log.clock = clock

    def fail_next(
        self, method: str, status: int, retry_after: float | None = None, times: int = 1
    ) -> None:
        """Answer the next `times` calls of `method` with `status` (429: Discord's shape)."""
        self._failures.add(method, Failure(status, retry_after, times=times))

    def _failure(self, method: str) -> web.Response | None:
        failure = self._failures.take(method)
        if failure is None:
            return None
        if failure.status == 429:
            retry_after = 1.0 if failure.retry_after is None else failure.retry_after
            # Without `Via` discord.py takes a 429 for a Cloudflare ban and raises.
            headers = {"Via": "1.1 google", "Retry-After": str(retry_after)}
            headers["X-RateLimit-Scope"] = "user"
            body = {"message": "You are being rate limited.", "retry_after": retry_after}
            return _json({**body, "global": False}, 429, headers)
        return _error(failure.status, 0, f"{failure.status}: injected failure")

    # ------------------------------------------------------------------ state views

    def message(self, channel_id: str, message_id: str) -> dict[str, Any]:
        return self.channels[channel_id].messages[message_id]

    def texts(self, channel_id: str) -> list[str]:
        """The current text of every live message in a channel, oldest first."""
        return [m["content"] for m in self.channels[channel_id].messages.values()]

    def last_message(self, channel_id: str) -> dict[str, Any]:
        return list(self.channels[channel_id].messages.values())[-1]

    def bot_texts(self, channel_id: str) -> list[str]:
        msgs = self.channels[channel_id].messages.values()
        return [m["content"] for m in msgs if m["author"]["id"] == BOT_ID]

    # ------------------------------------------------------------------ REST

    async def _not_found(self, request: web.Request) -> web.Response:
        self.log.record(f"unknown {request.method} {request.path}", {}, dict(request.headers))
        return _error(404, 0, "404: Not Found")

    def _route(self, verb: str, parts: list[str]) -> tuple[str, dict[str, str]] | None:
        match verb, parts:
            case "GET", ["users", "@me"]:
                return "get_current_user", {}
            case "POST", ["users", "@me", "channels"]:
                return "create_dm", {}
            case "GET", ["oauth2", "applications", "@me"]:
                return "get_application", {}
            case "GET", ["gateway"]:
                return "get_gateway", {}
            case "GET", ["gateway", "bot"]:
                return "get_gateway_bot", {}
            case "PUT", ["applications", app, "commands"]:
                return "bulk_overwrite_commands", {"application_id": app}
            case "GET", ["applications", app, "commands"]:
                return "get_commands", {"application_id": app}
            case "POST", ["channels", cid, "messages"]:
                return "create_message", {"channel_id": cid}
            case "PATCH", ["channels", cid, "messages", mid]:
                return "edit_message", {"channel_id": cid, "message_id": mid}
            case "DELETE", ["channels", cid, "messages", mid]:
                return "delete_message", {"channel_id": cid, "message_id": mid}
            case "POST", ["channels", cid, "typing"]:
                return "trigger_typing", {"channel_id": cid}
            case "POST", ["channels", cid, "messages", mid, "threads"]:
                return "start_thread", {"channel_id": cid, "message_id": mid}
            case "POST", ["interactions", iid, token, "callback"]:
                return "interaction_callback", {"interaction_id": iid, "token": token}
            case "POST", ["webhooks", app, token]:
                return "create_followup", {"application_id": app, "token": token}
            case "PATCH", ["webhooks", app, token, "messages", mid]:
                return "edit_followup", {"application_id": app, "token": token, "message_id": mid}
            case "DELETE", ["webhooks", app, token, "messages", mid]:
                return "delete_followup", {"application_id": app, "token": token, "message_id": mid}
        return None

    async def _rest(self, request: web.Request) -> web.Response:
        parts = [p for p in request.match_info["tail"].split("/") if p]
        routed = self._route(request.method, parts)
        if routed is None:
            return await self._not_found(request)
        method, path_params = routed
        body: Any = {}
        if request.can_read_body:
            if request.content_type != "application/json":
                return _error(400, 50109, "The request body contains invalid JSON.")
            body = await request.json()
        params = {**path_params, **request.query, **(body if isinstance(body, dict) else {})}
        if isinstance(body, list):
            params["items"] = body
        if self.network_jitter and isinstance(self.log.clock, FakeClock):
            # The request spends a while on the wire before Discord counts it.
            self.log.clock.now += self._jitter.uniform(0, self.network_jitter)
        call = self.log.record(method, params, dict(request.headers))
        if request.headers.get("Authorization") != f"Bot {TOKEN}" and not method.endswith(
            ("_followup", "interaction_callback")
        ):
            return _error(401, 0, "401: Unauthorized")
        failure = self._failure(method)
        if failure is not None:
            self.failed.append(call)
            return failure
        handler = getattr(self, f"_do_{method}")
        response: web.Response = await handler(params)
        return response

    async def _do_get_current_user(self, params: dict[str, Any]) -> web.Response:
        return _json({**BOT.payload(), "verified": True, "mfa_enabled": False, "flags": 0})

    async def _do_get_application(self, params: dict[str, Any]) -> web.Response:
        return _json(
            {
                "id": APP_ID,
                "name": "parley",
                "description": "",
                "icon": None,
                "bot_public": False,
                "bot_require_code_grant": False,
                "owner": USER.payload(),
                "verify_key": "0" * 64,
                "flags": 0,
            }
        )

    async def _do_get_gateway(self, params: dict[str, Any]) -> web.Response:
        return _json({"url": self.gateway_url})

    async def _do_get_gateway_bot(self, params: dict[str, Any]) -> web.Response:
        limit = {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
        return _json({"url": self.gateway_url, "shards": 1, "session_start_limit": limit})

    async def _do_bulk_overwrite_commands(self, params: dict[str, Any]) -> web.Response:
        self.commands = [
            {
                "id": str(next(self._ids)),
                "application_id": APP_ID,
                "version": "1",
                "type": 1,
                "default_member_permissions": None,
                **command,
            }
            for command in params["items"]
        ]
        return _json(self.commands)

    async def _do_get_commands(self, params: dict[str, Any]) -> web.Response:
        return _json(self.commands)

    async def _do_create_dm(self, params: dict[str, Any]) -> web.Response:
        recipient = next(u for u in (USER, STRANGER) if u.id == str(params["recipient_id"]))
        return _json({"id": DM_CHANNEL_ID, "type": 1, "recipients": [recipient.payload()]})

    def _bad_content(self, params: dict[str, Any], *, new: bool) -> web.Response | None:
        content = params.get("content")
        if content is not None and len(content) > MESSAGE_LIMIT:
            return _error(
                400, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length."
            )
        empty = not content and not params.get("components") and not params.get("embeds")
        if new and empty:
            return _error(400, 50006, "Cannot send an empty message")
        return None

    def _store(self, channel: _Channel, params: dict[str, Any], author: User) -> dict[str, Any]:
        message = {
            "id": str(next(self._ids)),
            "channel_id": channel.id,
            "author": author.payload(),
            "content": params.get("content") or "",
            "timestamp": TIMESTAMP,
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": params.get("flags") or 0,
            "components": params.get("components") or [],
        }
        if channel.guild_id:
            message["guild_id"] = channel.guild_id
        channel.messages[message["id"]] = message
        return message

    async def _do_create_message(self, params: dict[str, Any]) -> web.Response:
        channel = self.channels.get(params["channel_id"])
        if channel is None:
            return _error(404, 10003, "Unknown Channel")
        if (bad := self._bad_content(params, new=True)) is not None:
            return bad
        return _json(self._store(channel, params, BOT))

    async def _do_edit_message(self, params: dict[str, Any]) -> web.Response:
        channel = self.channels.get(params["channel_id"])
        message = channel.messages.get(params["message_id"]) if channel else None
        if message is None:
            return _error(404, 10008, "Unknown Message")
        if (bad := self._bad_content(params, new=False)) is not None:
            return bad
        for key in ("content", "components"):
            if key in params:
                message[key] = params[key] or ([] if key == "components" else "")
        message["edited_timestamp"] = TIMESTAMP
        return _json(message)

    async def _do_delete_message(self, params: dict[str, Any]) -> web.Response:
        channel = self.channels.get(params["channel_id"])
        if channel is None or channel.messages.pop(params["message_id"], None) is None:
            return _error(404, 10008, "Unknown Message")
        return web.Response(status=204)

    async def _do_trigger_typing(self, params: dict[str, Any]) -> web.Response:
        return web.Response(status=204)

    async def _do_start_thread(self, params: dict[str, Any]) -> web.Response:
        """Start Thread from Message: a public thread whose id is the message's, owned and
        joined by the bot; the gateway hears THREAD_CREATE (`newly_created`) first."""
        channel, mid = self.channels.get(params["channel_id"]), params["message_id"]
        if channel is None or mid not in channel.messages:
            return _error(404, 10008, "Unknown Message")
        if channel.guild_id is None or channel.id in _THREAD_IDS or channel.id in self.threads:
            return _error(400, 50024, "Cannot execute action on this channel type")
        if mid in self.channels:
            return _error(400, 160004, "A thread has already been created for this message")
        if not 1 <= len(params.get("name") or "") <= 100:
            return _error(400, 50035, "Invalid Form Body: name: Must be 1-100 in length.")
        self.channels[mid] = _Channel(mid, channel.guild_id)
        self.threads[mid] = thread = _thread_data(
            mid, str(params["name"]), BOT_ID, parent_id=channel.id, joined=True
        ) | {"message_count": 0, "member_count": 1}
        if self._sockets:  # a gateway client is there (not a REST-only one)
            await self.dispatch("THREAD_CREATE", thread | {"newly_created": True})
        return _json(thread)

    async def _do_interaction_callback(self, params: dict[str, Any]) -> web.Response:
        interaction = self.interactions.get(params["interaction_id"])
        if interaction is None or interaction["token"] != params["token"]:
            return _error(404, 10062, "Unknown interaction")
        if interaction.get("answered"):
            return _error(400, 40060, "Interaction has already been acknowledged.")
        interaction["answered"] = params
        kind = params["type"]
        data = params.get("data") or {}
        result: dict[str, Any] = {
            "interaction": {
                "id": interaction["id"],
                "type": interaction["type"],
                "response_message_loading": kind == 5,
                "response_message_ephemeral": bool(data.get("flags", 0) & EPHEMERAL),
            }
        }
        if kind in (4, 7):
            channel = self.channels[interaction["channel_id"]]
            if kind == 7:
                message = channel.messages[interaction["message"]["id"]]
                message.update({k: data[k] for k in ("content", "components") if k in data})
            elif data.get("flags", 0) & EPHEMERAL:  # seen by the invoker only, not in history
                message = self._store(_Channel(channel.id, channel.guild_id), data, BOT)
                self.ephemeral.append(message)
            else:
                message = self._store(channel, data, BOT)
            result["interaction"]["response_message_id"] = message["id"]
            result["resource"] = {"type": kind, "message": message}
        return _json(result)

    async def _do_create_followup(self, params: dict[str, Any]) -> web.Response:
        interaction = self._by_token(params["token"])
        if interaction is None:
            return _error(404, 10015, "Unknown Webhook")
        if (bad := self._bad_content(params, new=True)) is not None:
            return bad
        return _json(self._store(self.channels[interaction["channel_id"]], params, BOT))

    async def _do_edit_followup(self, params: dict[str, Any]) -> web.Response:
        interaction = self._by_token(params["token"])
        if interaction is None:
            return _error(404, 10015, "Unknown Webhook")
        return await self._do_edit_message({**params, "channel_id": interaction["channel_id"]})

    async def _do_delete_followup(self, params: dict[str, Any]) -> web.Response:
        interaction = self._by_token(params["token"])
        if interaction is None:
            return _error(404, 10015, "Unknown Webhook")
        return await self._do_delete_message({**params, "channel_id": interaction["channel_id"]})

    def _by_token(self, token: str) -> dict[str, Any] | None:
        return next((i for i in self.interactions.values() if i["token"] == token), None)

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.add(ws)
        self.log.record("gateway.connect", {"path": request.path, **request.query}, {})
        try:
            await self._send(ws, {"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}})
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                await self._on_op(ws, json.loads(frame.data))
        finally:
            self._sockets.discard(ws)
            self._sessions.discard(ws)
            if self._ws is ws:
                self._ws = None
                self._identified.clear()
        return ws

    async def _send(self, ws: web.WebSocketResponse, payload: dict[str, Any]) -> None:
        async with self._send_lock:
            await ws.send_str(json.dumps(payload))

    async def _dispatch_on(self, ws: web.WebSocketResponse, event: str, data: Any) -> None:
        self._seq += 1
        await self._send(ws, {"op": 0, "t": event, "s": self._seq, "d": data})

    async def _on_op(self, ws: web.WebSocketResponse, payload: dict[str, Any]) -> None:
        op, data = payload.get("op"), payload.get("d")
        if op == 1:
            self.log.record("gateway.heartbeat", {"seq": data}, {})
            await self._send(ws, {"op": 11})
        elif op == 2:
            self.log.record("gateway.identify", dict(data), {})
            if data.get("token") != TOKEN:
                await ws.close(code=4004, message=b"Authentication failed.")
                return
            self.identify_intents = int(data.get("intents", 0))
            self._seq = 0
            await self._dispatch_on(ws, "READY", self._ready())
            await self._dispatch_on(ws, "GUILD_CREATE", self._guild())
            self._session(ws)
            self._identified.set()
        elif op == 6:
            self.log.record("gateway.resume", dict(data), {})
            if data.get("session_id") != self.session_id:
                await self._send(ws, {"op": 9, "d": False})
                return
            replay, self._replay = self._replay, []
            for event, event_data in replay:
                await self._dispatch_on(ws, event, event_data)
            await self._dispatch_on(ws, "RESUMED", {})
            self._session(ws)
            self._identified.set()

    def _session(self, ws: web.WebSocketResponse) -> None:
        self._ws = ws
        self._sessions.add(ws)
        self.most_sessions = max(self.most_sessions, len(self._sessions))

    def _ready(self) -> dict[str, Any]:
        return {
            "v": 10,
            "user": {**BOT.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
            "guilds": [{"id": GUILD_ID, "unavailable": True}],
            "session_id": self.session_id,
            "resume_gateway_url": self.resume_gateway_url,
            "application": {"id": APP_ID, "flags": 0},
            "private_channels": [],
            "relationships": [],
        }

    def _guild(self) -> dict[str, Any]:
        def thread(tid: str, name: str, joined: bool) -> dict[str, Any]:
            return _thread_data(tid, name, USER.id, joined=joined)

        return {
            "id": GUILD_ID,
            "name": "Fake guild",
            "owner_id": USER.id,
            "member_count": 4,
            "large": False,
            "unavailable": False,
            "features": [],
            "roles": [
                {
                    "id": GUILD_ID,
                    "name": "@everyone",
                    "permissions": "2147483647",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                },
                {
                    "id": ONCALL_ROLE_ID,
                    "name": "oncall",
                    "permissions": "0",
                    "position": 1,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": True,
                },
            ],
            "emojis": [],
            "stickers": [],
            "members": [BOT.member()],
            "channels": [
                {
                    "id": CHANNEL_ID,
                    "guild_id": GUILD_ID,
                    "name": "general",
                    "type": 0,
                    "position": 0,
                    "permission_overwrites": [],
                    "nsfw": False,
                    "parent_id": None,
                }
            ],
            "threads": [
                thread(BOT_THREAD_ID, "bot thread", joined=True),
                thread(OTHER_THREAD_ID, "other thread", joined=False),
                *self.threads.values(),
            ],
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    async def dispatch(self, event: str, data: Any, *, timeout: float = 10.0) -> None:
        """Send one gateway event to the connected client (waits for its IDENTIFY)."""
        async with asyncio.timeout(timeout):
            await self._identified.wait()
        assert self._ws is not None
        await self._dispatch_on(self._ws, event, data)

    async def resume_with_replay(self, *events: tuple[str, Any], timeout: float = 10.0) -> None:
        """Ask the client to reconnect (op 7); on its RESUME replay `events`, then RESUMED.

        This is how Discord redelivers: events seen before a reconnect arrive again."""
        async with asyncio.timeout(timeout):
            await self._identified.wait()
        ws, self._ws = self._ws, None
        assert ws is not None
        self._identified.clear()
        self._replay = list(events)
        resumes = len(self.calls_of("gateway.resume"))
        await self._send(ws, {"op": 7, "d": None})
        await self.wait_for("gateway.resume", count=resumes + 1, timeout=timeout)

    # ------------------------------------------------------------------ inbound events

    def message_event(
        self,
        text: str,
        *,
        author: User = USER,
        channel_id: str = CHANNEL_ID,
        mention: bool = False,
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """A MESSAGE_CREATE payload (`mention` prefixes `<@bot>` as a client does). Like
        Discord, it lists the known users (`USERS`) and roles mentioned in the content, a
        user with their guild `member` data in a guild channel."""
        channel = self.channels[channel_id]
        content = f"<@{BOT_ID}> {text}" if mention else text
        mentioned = [USERS[i] for i in dict.fromkeys(_USER_MENTION.findall(content)) if i in USERS]
        mentions = [
            u.payload() | ({"member": _without_user(u.member())} if channel.guild_id else {})
            for u in mentioned
        ]
        roles = [r for r in dict.fromkeys(_ROLE_MENTION.findall(content)) if r == ONCALL_ROLE_ID]
        if channel.guild_id and not (self.identify_intents or 0) & MESSAGE_CONTENT_INTENT:
            content = ""  # Discord blanks guild message content without the intent
        data: dict[str, Any] = {
            "id": message_id or str(next(self._ids)),
            "channel_id": channel_id,
            "author": author.payload(),
            "content": content,
            "timestamp": TIMESTAMP,
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": mentions,
            "mention_roles": roles,
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
        }
        if channel.guild_id:
            data["guild_id"] = channel.guild_id
            data["member"] = _without_user(author.member())
        return data

    async def send_message(self, text: str, **kwargs: Any) -> dict[str, Any]:
        data = self.message_event(text, **kwargs)
        await self.dispatch("MESSAGE_CREATE", data)
        return data

    async def dm(self, text: str, *, author: User = USER, **kwargs: Any) -> dict[str, Any]:
        return await self.send_message(text, author=author, channel_id=DM_CHANNEL_ID, **kwargs)

    async def mention(self, text: str, **kwargs: Any) -> dict[str, Any]:
        return await self.send_message(text, mention=True, **kwargs)

    async def from_bot(self, text: str, **kwargs: Any) -> dict[str, Any]:
        """A message from another bot (a DM unless `channel_id` is given)."""
        kwargs.setdefault("channel_id", DM_CHANNEL_ID)
        return await self.send_message(text, author=OTHER_BOT, **kwargs)

    async def from_self(self, text: str, **kwargs: Any) -> dict[str, Any]:
        """A message the bot itself wrote, echoed back by the gateway."""
        kwargs.setdefault("channel_id", DM_CHANNEL_ID)
        return await self.send_message(text, author=BOT, **kwargs)

    async def redeliver(self, event: dict[str, Any]) -> None:
        """The same MESSAGE_CREATE once more (same message id)."""
        await self.dispatch("MESSAGE_CREATE", event)

    async def thread_message(
        self, text: str, *, thread_id: str = BOT_THREAD_ID, **kwargs: Any
    ) -> dict[str, Any]:
        return await self.send_message(text, channel_id=thread_id, **kwargs)

    def _interaction(
        self, kind: int, data: dict[str, Any], user: User, channel_id: str
    ) -> dict[str, Any]:
        channel = self.channels[channel_id]
        interaction_id = str(next(self._ids))
        payload: dict[str, Any] = {
            "id": interaction_id,
            "application_id": APP_ID,
            "type": kind,
            "token": f"itoken-{interaction_id}",
            "version": 1,
            "channel_id": channel_id,
            "data": data,
            "locale": "en-US",
            "app_permissions": "2147483647",
            "entitlements": [],
            "authorizing_integration_owners": {"0": GUILD_ID} if channel.guild_id else {},
            "context": 0 if channel.guild_id else 1,
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        if channel.guild_id:
            payload["guild_id"] = channel.guild_id
            payload["guild_locale"] = "en-US"
            payload["member"] = user.member()
            thread = channel_id in _THREAD_IDS or channel_id in self.threads
            payload["channel"] = {
                "id": channel_id,
                "type": 11 if thread else 0,
                "guild_id": channel.guild_id,
                **({"parent_id": CHANNEL_ID} if thread else {}),
            }
        else:
            payload["user"] = user.payload()
            payload["channel"] = {"id": channel_id, "type": 1}
        self.interactions[interaction_id] = payload
        return payload

    async def command(
        self,
        name: str,
        args: str | None = None,
        *,
        user: User = USER,
        channel_id: str = CHANNEL_ID,
    ) -> dict[str, Any]:
        """A slash command invocation (INTERACTION_CREATE type 2) of a synced command."""
        known = {c["name"]: c for c in self.commands}
        data: dict[str, Any] = {
            "id": known[name]["id"] if name in known else str(next(self._ids)),
            "name": name,
            "type": 1,
        }
        if args is not None:
            option = next(o["name"] for o in known[name].get("options", []))
            data["options"] = [{"name": option, "type": 3, "value": args}]
        payload = self._interaction(2, data, user, channel_id)
        await self.dispatch("INTERACTION_CREATE", payload)
        return payload

    async def click(
        self, channel_id: str, message_id: str, custom_id: str, *, user: User = USER
    ) -> dict[str, Any]:
        """A button click (INTERACTION_CREATE type 3) on a message the bot posted."""
        message = self.message(channel_id, message_id)
        data = {"custom_id": custom_id, "component_type": 2}
        payload = self._interaction(3, data, user, channel_id)
        payload["message"] = message
        await self.dispatch("INTERACTION_CREATE", payload)
        return payload

    def buttons(self, channel_id: str, message_id: str) -> list[dict[str, Any]]:
        """The buttons currently on a message (empty once they were removed)."""
        rows = self.message(channel_id, message_id).get("components") or []
        return [c for row in rows for c in row.get("components", [])]

    def answer_to(self, interaction: dict[str, Any]) -> dict[str, Any] | None:
        """The callback the client sent for an interaction (None if not yet answered)."""
        answered: dict[str, Any] | None = self.interactions[interaction["id"]].get("answered")
        return answered
