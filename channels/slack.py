"""Slack adapter on slack-bolt's `AsyncApp`: Socket Mode by default, HTTP Events API optional.

Where a reply goes: always in the thread of the triggering message (`thread_ts` = the
message's `thread_ts`, or its own `ts` when it starts a thread). A channel conversation is
keyed by that root ts, so a thread and its parent channel never both answer; a DM is one
conversation (thread id "") unless the DM message was itself in a thread.

Each message maps to one conversation: Slack sends both `app_mention` and `message` for a
mention, and retries late acks, so inbound events are de-duplicated by `channel:ts` (kept
here for the moment, and in the agent's store across restarts).

Bot threads: the bot answers un-mentioned channel messages only in threads it is part of —
those it posted in, and the root of every conversation it answered (kept in memory).

Stored before acknowledged: bolt acknowledges an event when its listener returns, so the
message listener returns only once the agent has stored the message as a queued run (or
has dropped it as a duplicate, or the gate has refused it). If that takes longer than
Slack's ack budget, or fails, the event is left unacknowledged and Slack delivers it
again; the store drops the copy if the first one was committed after all. A crash before
the commit therefore never loses a message. Commands act at once and store nothing, so
they are acknowledged at once.

This module is the adapter's lifecycle and its bolt listeners. Beside it: the Web API
edge (`slack_api`), where answers go (`slack_reply`), native streaming (`slack_stream`),
the thread's status (`slack_status`), assistant threads (`slack_assistant`), approval
blocks (`slack_blocks`), events on their way in (`slack_events`), the HTTP endpoint
(`slack_http`), settings (`slack_config`).
Receipt is shown with `ack_reaction`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.approvals import Approvals, parse_approval_button
from channels.gate import Gate
from channels.inbound import slack_markdown, slack_user_ids
from channels.retry import call_with_retry
from channels.slack_api import escape, failure_detail, slack_call
from channels.slack_assistant import AssistantThreads
from channels.slack_blocks import ACTIONS, approval_blocks
from channels.slack_config import SlackConfig, tokens
from channels.slack_events import (
    HANDLED_SUBTYPES,
    Recent,
    Taken,
    UserNames,
    command_text,
    react,
)
from channels.slack_groups import UserGroups
from channels.slack_http import events_app
from channels.slack_reply import SlackResponder, start_thread
from channels.slack_status import ThreadStatus
from core.chat import AgentPort, ApprovalRequest, ConversationKey, Deciders, Inbound
from core.clock import Clock, SystemClock
from core.command_table import CHANNEL_WIDE
from core.errors import ChannelError
from core.lease import Singleton

log = logging.getLogger(__name__)

T = TypeVar("T")

EVENTS_PATH = "/slack/events"
STOP_GRACE = 2.0  # seconds stop() lets in-flight events reach the agent
ACK_BUDGET = 2.5  # seconds a listener may hold the ack (Slack retries after 3 s)


class SlackChannel:
    """The Slack adapter (docs/channels.md): bolt handlers → `Inbound` → `agent.submit`."""

    name = "slack"

    def __init__(
        self,
        config: SlackConfig,
        environ: Mapping[str, str],
        *,
        clock: Clock | None = None,
        deciders: Deciders | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self._bot_token, self._app_token, self._signing_secret = tokens(config, environ)
        self.client = AsyncWebClient(token=self._bot_token, base_url=config.base_url)
        self.approvals = Approvals(
            config.approvers, clock=self.clock, deciders=deciders, platform=self.name
        )
        self._groups = UserGroups(self.client, self.clock)
        self._gate = Gate(config, clock=self.clock)
        self._agent: AgentPort | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen = Recent(4096)
        self._threads = Recent(10_000)
        self._names = UserNames(self.client, self._spawn)
        self._turns: dict[ConversationKey, asyncio.Future[None]] = {}  # see _take
        self.assistant = AssistantThreads(self.client, config, self.clock)
        self.streaming_supported = True  # until Slack says this workspace or token cannot
        self.bot_user_id = self.bot_id = self.team_id = ""
        self.http_url = ""  # HTTP mode: where Slack posts events, once started

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self, agent: AgentPort) -> None:
        self._agent = agent
        auth = await self._checked("auth.test", self.config.bot_token_env, self.client.auth_test)
        self.bot_user_id, self.bot_id = str(auth.get("user_id", "")), str(auth.get("bot_id", ""))
        self.team_id = str(auth.get("team_id", ""))
        app = AsyncApp(
            client=self.client,
            signing_secret=self._signing_secret,
            request_verification_enabled=self.config.mode == "http",
            # The ack waits for the listener: a message is acknowledged once it is stored.
            # Bolt keeps no untracked listener tasks of its own this way, either.
            process_before_response=True,
            logger=log,
        )
        app.event("message")(self._on_event)
        app.event("app_mention")(self._on_event)
        app.event("assistant_thread_started")(self._on_thread_started)
        app.event("assistant_thread_context_changed")(self._on_context_changed)
        app.command(re.compile(r"^/.+"))(self._on_command)
        app.action(re.compile(f"^({'|'.join(ACTIONS)})$"))(self._on_action)
        try:
            if self.config.mode == "socket":
                await self._connect_socket(app)
            else:
                await self._serve_http(app)
        except BaseException:
            await self.stop()
            raise
        log.info("slack connected as %s (%s mode)", self.bot_user_id, self.config.mode)

    async def _connect_socket(self, app: AsyncApp) -> None:
        self._socket = AsyncSocketModeHandler(app, app_token=self._app_token, logger=log)
        client = self._socket.client
        # Fetch the first URL here so a bad app token fails start() instead of being
        # retried forever inside the socket client.
        client.wss_uri = await self._checked(
            "apps.connections.open", self.config.app_token_env, client.issue_new_wss_url
        )
        await self._socket.connect_async()  # type: ignore[no-untyped-call]  # bolt leaves it untyped

    async def _serve_http(self, app: AsyncApp) -> None:
        """Bolt's aiohttp route (signature checks included; bodies bolt cannot read get
        400, `channels.slack_http`) on http_listen:http_port."""
        web_app = events_app(app, EVENTS_PATH, self._signing_secret)
        self._runner = web.AppRunner(web_app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.http_listen, self.config.http_port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.http_url = f"http://{host}:{port}{EVENTS_PATH}"

    async def _checked(self, what: str, token_env: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call_with_retry(
                lambda: slack_call(call()), clock=self.clock, what=f"slack {what}"
            )
        except ChannelError as exc:
            detail = failure_detail(exc)
            raise ChannelError(f"slack {what} failed: {detail} (check {token_env})") from exc

    async def stop(self) -> None:
        if self._socket is not None:
            socket, self._socket = self._socket, None
            await socket.close_async()  # type: ignore[no-untyped-call]  # bolt leaves it untyped
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._tasks:  # let events already received reach the agent, briefly
            await asyncio.wait(set(self._tasks), timeout=STOP_GRACE)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def settled(self) -> None:
        """Wait until every event received so far has been handled (handed to the agent,
        or dropped)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def responder(self, key: ConversationKey) -> SlackResponder:
        _, channel_id, thread_id = key
        return SlackResponder(self, channel_id, thread_id or None)

    async def open_thread(self, channel_id: str, header: str) -> str:
        """The header's ts (`channels.slack_reply.start_thread`); see `channels.base`."""
        return await start_thread(self, channel_id, header)

    def access(self) -> str:
        return self.config.who()

    def singletons(self) -> list[Singleton]:
        """None: Socket Mode allows several connections per app, and HTTP mode sits behind
        a load balancer like any web service."""
        return []

    def thread_status(self, channel_id: str, thread_ts: str) -> ThreadStatus:
        return self.assistant.status(channel_id, thread_ts)

    def no_streaming(self) -> None:
        if self.streaming_supported:
            log.warning(
                "slack: this workspace or token cannot stream answers (chat.startStream); "
                "answers are streamed by edits (see docs/channels.md#slack-native-streaming)"
            )
        self.streaming_supported = False

    def remember_thread(self, channel_id: str, thread_ts: str) -> None:
        if not channel_id.startswith("D"):
            self._threads.add((channel_id, thread_ts))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("slack handler failed: %s", exc, exc_info=exc)

    # ---- bolt listeners: hand over, then acknowledge -----------------------------------------

    async def _on_event(self, event: dict[str, Any]) -> BoltResponse | None:
        """Returns (and so lets bolt acknowledge the event) once the message is stored; a
        503 leaves it unacknowledged, so Slack delivers it again."""
        taken = self._take(event)
        if taken is None:
            return None  # nothing to store: an edit, a duplicate, someone not allowed
        inbound = taken.inbound
        # A task, not an await: the hand-over finishes even if the listener gives up.
        handover = self._spawn(self._hand_over(taken))
        if inbound.command is not None:
            return None  # commands act at once and store nothing: no reason to wait
        await asyncio.wait({handover}, timeout=ACK_BUDGET)
        if not handover.done():
            why = f"still waiting for the store after {ACK_BUDGET:g} s"
        elif handover.cancelled() or handover.exception() is not None:
            why = "handing it over failed"
        else:
            return None
        log.warning(
            "slack: event %s is not stored (%s); leaving it unacknowledged so that Slack "
            "delivers it again",
            inbound.event_id,
            why,
        )
        return BoltResponse(status=503, body="")

    async def _on_thread_started(self, event: dict[str, Any]) -> None:
        self._spawn(self.assistant.started(event))

    async def _on_context_changed(self, event: dict[str, Any]) -> None:
        self.assistant.context_changed(event)

    async def _on_command(
        self, ack: Callable[[], Awaitable[None]], command: dict[str, Any]
    ) -> None:
        await ack()
        self._spawn(self._handle_command(command))

    async def _on_action(
        self, ack: Callable[[], Awaitable[None]], body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        await ack()
        self._spawn(self._handle_click(body, action))

    # ---- inbound ----------------------------------------------------------------------------

    def _normalise(self, event: dict[str, Any]) -> tuple[Inbound, bool, bool, bool] | None:
        """(inbound, from_bot, from_self, in_bot_thread) for a message event, or None for
        edits, joins, empty text and other events that are not someone writing to the bot."""
        channel_id, ts = str(event.get("channel", "")), str(event.get("ts", ""))
        if event.get("subtype") not in HANDLED_SUBTYPES or not channel_id or not ts:
            return None
        bot_id = event.get("bot_id")
        user_id = str(event.get("user") or bot_id or "")
        from_self = user_id == self.bot_user_id or (bot_id is not None and bot_id == self.bot_id)
        from_bot = bool(bot_id) or event.get("subtype") == "bot_message"
        is_dm = event.get("channel_type") == "im" or channel_id.startswith("D")
        thread_ts = str(event.get("thread_ts") or "")
        raw = str(event.get("text") or "")
        text = self._markdown(raw)
        if not text:  # a bare mention, a file without a caption: nothing to answer
            return None
        inbound = Inbound(
            channel=self.name,
            channel_id=channel_id,
            thread_id=thread_ts if is_dm else (thread_ts or ts),
            user_id=user_id,
            user_name=user_id,
            text=text,
            is_dm=is_dm,
            mentions_bot=event.get("type") == "app_mention"
            or self._bot_mention().search(raw) is not None,
            event_id=f"{channel_id}:{ts}",
            message_id=ts,
        )
        # a thread this worker posted in, or one under a post of the bot's (any worker's:
        # a trigger's header, docs/triggers.md), which Slack says in `parent_user_id`
        in_bot_thread = bool(thread_ts) and (
            (channel_id, thread_ts) in self._threads
            or event.get("parent_user_id") == self.bot_user_id
        )
        return inbound, from_bot, from_self, in_bot_thread

    def _bot_mention(self) -> re.Pattern[str]:
        return re.compile(rf"<@{re.escape(self.bot_user_id)}(?:\|[^>]*)?>")

    def _markdown(self, raw: str) -> str:
        """The text as the agent reads it: without the bot's mention, mrkdwn as Markdown,
        users by the names known so far (`channels.inbound`), `!stop` as `/stop`. The event
        keeps the raw text."""
        body = self._bot_mention().sub("", raw)
        return command_text(slack_markdown(body, self._names.get).strip())

    def _take(self, event: dict[str, Any]) -> Taken | None:
        """A message event as what to hand to the agent, or None if it is not for it."""
        normalised = self._normalise(event)
        if normalised is None:
            return None
        inbound, from_bot, from_self, in_bot_thread = normalised
        # app_mention + message for one ts, and Slack's retries, collapse here.
        if inbound.event_id in self._seen:
            return None
        self._seen.add(inbound.event_id)
        if not self._gate.admit(
            inbound, from_bot=from_bot, from_self=from_self, in_bot_thread=in_bot_thread
        ):
            return None
        if not inbound.is_dm:
            self.remember_thread(inbound.channel_id, inbound.thread_id)
        # The author's display name is looked up after submit, for their next message.
        inbound = replace(inbound, user_name=self._names.name_of(inbound.user_id))
        # Channels: always the thread of the triggering message (its root ts). DMs: at top
        # level, so the whole DM stays one conversation (unless the user used a thread).
        thread_ts = event.get("thread_ts")
        reply_in = str(thread_ts) if thread_ts else (None if inbound.is_dm else str(event["ts"]))
        raw = str(event.get("text") or "")
        unnamed = [
            user
            for user in slack_user_ids(raw)
            if user not in self._names and user != self.bot_user_id
        ]
        # Messages of one conversation reach the agent in the order they came, though some
        # wait for names first: each waits for the one before it to be submitted.
        before = self._turns.get(inbound.key)
        turn = asyncio.get_running_loop().create_future()
        self._turns[inbound.key] = turn
        turn.add_done_callback(functools.partial(self._turn_taken, inbound.key))
        recipient = None
        if not inbound.is_dm:  # a channel stream names its reader (Slack Connect: their team)
            team = str(event.get("user_team") or event.get("team") or self.team_id)
            recipient = (inbound.user_id, team)
        if reply_in is not None and inbound.command is None:
            self._spawn(self.assistant.title(inbound.channel_id, reply_in, inbound.text))
            if line := self.assistant.context_line(inbound.channel_id, reply_in):
                inbound = replace(inbound, text=f"{line}\n{inbound.text}")
        responder = SlackResponder(self, inbound.channel_id, reply_in, recipient=recipient)
        return Taken(inbound, responder, raw, unnamed, before, turn)

    def _turn_taken(self, key: ConversationKey, turn: asyncio.Future[None]) -> None:
        if self._turns.get(key) is turn:
            del self._turns[key]

    async def _hand_over(self, taken: Taken) -> None:
        """Submit; returns once the agent has stored the message (or dropped a duplicate).
        Nothing is awaited before submit unless a mentioned user's name must be looked up
        or an earlier message of the conversation is still doing so."""
        inbound = taken.inbound
        try:
            try:
                if taken.unnamed:
                    await self._names.learn_all(taken.unnamed)
                    inbound = replace(inbound, text=self._markdown(taken.raw))
                if taken.before is not None and not taken.before.done():
                    await asyncio.wait({taken.before})
            finally:
                if not taken.turn.done():
                    taken.turn.set_result(None)
            submitted = await self._submit(inbound, taken.responder)
        except BaseException:
            self._seen.discard(inbound.event_id)  # Slack's redelivery gets another go
            raise
        if submitted and self.config.ack_reaction:
            reaction = self.config.ack_reaction
            self._spawn(
                react(self.client, self.clock, inbound.channel_id, inbound.message_id, reaction)
            )
        if inbound.user_id not in self._names:
            self._spawn(self._names.learn(inbound.user_id))

    async def _handle_command(self, command: dict[str, Any]) -> None:
        name, args = str(command.get("command", "")), str(command.get("text", "")).strip()
        if name == "/parley":
            text = "/" + args.lstrip("/!") if args else "/help"
        else:
            text = f"{name} {args}".strip()
        channel_id = str(command.get("channel_id", ""))
        inbound = Inbound(
            channel=self.name,
            channel_id=channel_id,
            thread_id="",
            user_id=str(command.get("user_id", "")),
            user_name=str(command.get("user_name") or command.get("user_id", "")),
            text=text,
            is_dm=channel_id.startswith("D"),
            mentions_bot=True,  # a slash command is addressed to the bot
            event_id=f"command:{command.get('trigger_id', '')}",
        )
        if not self._gate.admit(inbound, from_bot=False, from_self=False):
            return
        command_name = text.split(maxsplit=1)[0].lstrip("/")
        if not inbound.is_dm and command_name not in CHANNEL_WIDE:
            # In a channel every conversation is a thread: a slash command typed at channel
            # level cannot say which one it means.
            hint = f"Type `!{command_name}` in the thread you mean."
            await self._tell_privately(channel_id, inbound.user_id, hint)
            return
        responder = SlackResponder(
            self, channel_id, None, response_url=command.get("response_url") or None
        )
        await self._submit(inbound, responder)

    async def _submit(self, inbound: Inbound, responder: SlackResponder) -> bool:
        assert self._agent is not None, "start() first"
        if self.approvals.wants_groups():  # roles name Slack user groups
            inbound = replace(inbound, groups=await self._groups.of(inbound.user_id))
        return await self._agent.submit(inbound, responder)

    async def _handle_click(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        parsed = parse_approval_button(str(action.get("value", "")))
        user = body.get("user") or {}
        user_id = str(user.get("id", ""))
        container = body.get("container") or {}
        channel_id = str(container.get("channel_id") or (body.get("channel") or {}).get("id", ""))
        if parsed is None or not user_id or not channel_id:
            return
        name = str(user.get("name") or user.get("username") or user_id)
        groups = await self._groups.of(user_id) if self.approvals.wants_groups() else ()
        outcome = await self.approvals.resolve_click(
            parsed.request_id,
            user_id,
            name,
            parsed.allow,
            agent=self._agent,
            settle=self.settle_prompt,
            scope=parsed.scope,
            groups=groups,
        )
        if outcome == "ok":
            return
        note = (
            self.approvals.refusal()
            if outcome == "not_approver"
            else "This request is no longer waiting for an answer."
        )
        thread_ts = (body.get("message") or {}).get("thread_ts")
        await self._tell_privately(channel_id, user_id, note, thread_ts)

    async def _tell_privately(
        self, channel_id: str, user_id: str, text: str, thread_ts: str | None = None
    ) -> None:
        """An ephemeral message only `user_id` sees."""
        await call_with_retry(
            lambda: slack_call(
                self.client.chat_postEphemeral(
                    channel=channel_id, user=user_id, text=text, thread_ts=thread_ts
                )
            ),
            clock=self.clock,
            what="slack chat.postEphemeral",
        )

    async def settle_prompt(self, request: ApprovalRequest, outcome: str) -> None:
        """Edit the approval prompt to show the outcome instead of the buttons."""
        prompt = request.prompt
        if prompt is None:
            return
        await call_with_retry(
            lambda: slack_call(
                self.client.chat_update(
                    channel=prompt.channel_id,
                    ts=prompt.message_id,
                    text=escape(outcome),
                    blocks=approval_blocks(request, outcome=outcome),
                )
            ),
            clock=self.clock,
            what="slack approval settle",
        )
