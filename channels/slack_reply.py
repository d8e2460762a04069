"""Where the bot's output goes in Slack: a `Surface` for the reply streamer (one thread,
DM or channel top level), the `Responder` of one conversation, with its approval
prompts, its thread status (`channels.slack_status`), native streaming where it can
(`channels.slack_stream`) and the `response_url` fallback for slash commands, and the
header a trigger's thread starts with (`start_thread`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from channels.approvals import Approvals
from channels.retry import call_with_retry
from channels.slack_api import LIMIT_BYTES, escape, slack_call, slack_size
from channels.slack_blocks import approval_blocks
from channels.slack_config import SlackConfig
from channels.slack_status import APPROVAL, THINKING, ThreadStatus
from channels.slack_stream import NativeStream, StreamTarget
from channels.stream import ReplyStreamer, deliver
from channels.text import split_message, to_slack_mrkdwn
from core.chat import ApprovalRequest, PreviewStream, PromptRef
from core.clock import Clock
from core.errors import ChannelRefused, DeliveryFailed
from core.fence import admit
from core.secrets import scrub


class SlackHost(Protocol):
    """What a responder uses of its channel (`channels.slack.SlackChannel`)."""

    client: AsyncWebClient
    clock: Clock
    config: SlackConfig
    approvals: Approvals

    streaming_supported: bool

    def remember_thread(self, channel_id: str, thread_ts: str) -> None: ...

    def thread_status(self, channel_id: str, thread_ts: str) -> ThreadStatus: ...

    def no_streaming(self) -> None: ...

    async def settle_prompt(self, request: ApprovalRequest, outcome: str) -> None: ...


class SlackSurface:
    """One place to post: a channel's thread (or a DM / channel top level)."""

    limit = LIMIT_BYTES

    def __init__(self, slack: SlackHost, channel_id: str, thread_ts: str | None) -> None:
        self._slack, self._channel_id, self._thread_ts = slack, channel_id, thread_ts

    def measure(self, text: str) -> int:
        return slack_size(text)

    @staticmethod
    def _body(text: str, final: bool) -> str:
        # A refused mrkdwn body propagates: the streamer then sends the text plain.
        return to_slack_mrkdwn(text) if final else escape(text)

    async def post(self, text: str, *, final: bool) -> str:
        client, body = self._slack.client, self._body(text, final)
        response = await slack_call(
            client.chat_postMessage(
                channel=self._channel_id,
                thread_ts=self._thread_ts,
                text=body,
                unfurl_links=False,
                unfurl_media=False,
            )
        )
        ts = str(response["ts"])
        self._slack.remember_thread(self._channel_id, self._thread_ts or ts)
        return ts

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        client, body = self._slack.client, self._body(text, final)
        await slack_call(client.chat_update(channel=self._channel_id, ts=message_id, text=body))

    async def delete(self, message_id: str) -> None:
        try:
            await slack_call(
                self._slack.client.chat_delete(channel=self._channel_id, ts=message_id)
            )
        except ChannelRefused as exc:
            if exc.code != "message_not_found":
                raise


class SlackResponder:
    """Answers one conversation: in `thread_ts` of `channel_id` (top level when None)."""

    def __init__(
        self,
        slack: SlackHost,
        channel_id: str,
        thread_ts: str | None,
        *,
        response_url: str | None = None,
        recipient: tuple[str, str] | None = None,
    ) -> None:
        self._slack, self._channel_id, self._thread_ts = slack, channel_id, thread_ts
        self._response_url = response_url
        self._recipient = recipient  # (user id, team id) a channel stream is streamed to

    def _surface(self) -> SlackSurface:
        return SlackSurface(self._slack, self._channel_id, self._thread_ts)

    async def send(self, text: str) -> None:
        try:
            await deliver(self._surface(), text, clock=self._slack.clock)
        except DeliveryFailed:
            if self._response_url is None:
                raise
            # A slash command from a channel the bot is not in: answer through response_url.
            await self._respond(text)

    async def _respond(self, text: str) -> None:
        assert self._response_url is not None
        webhook = AsyncWebhookClient(self._response_url)
        for piece in split_message(scrub(text), LIMIT_BYTES, slack_size):
            sending = webhook.send(text=to_slack_mrkdwn(piece), response_type="in_channel")
            await admit(sending)  # as `slack_call`: not for a run this worker lost
            response = await sending
            if response.status_code != 200:
                raise DeliveryFailed(f"response_url answered {response.status_code}")

    def _status(self) -> ThreadStatus | None:
        if self._thread_ts is None or not self._slack.config.thread_status:
            return None  # Slack shows statuses in threads only
        return self._slack.thread_status(self._channel_id, self._thread_ts)

    def _target(self) -> StreamTarget | None:
        """Where a native stream can go, or None if this answer cannot stream natively."""
        slack = self._slack
        if slack.config.streaming != "native" or not slack.streaming_supported:
            return None
        if self._thread_ts is None:
            return None  # a stream is always a reply in a thread
        is_dm = self._channel_id.startswith("D")
        if not is_dm and self._recipient is None:
            return None  # in a channel Slack needs the reader (a restart's responder has none)
        user, team = self._recipient or (None, None)
        return StreamTarget(slack.client, self._channel_id, self._thread_ts, user, team)

    def stream(self) -> PreviewStream:
        slack = self._slack
        interval = slack.config.edit_interval_seconds
        edits = ReplyStreamer(self._surface(), clock=slack.clock, min_interval=interval)
        target, status = self._target(), self._status()
        if target is None and status is None:
            return edits
        return NativeStream(
            target or StreamTarget(slack.client, self._channel_id, self._thread_ts or ""),
            edits,
            clock=slack.clock,
            min_interval=interval,
            status=status,
            unsupported=slack.no_streaming,
            native=target is not None,
        )

    @contextlib.asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        """Slack has no typing indicator for bots: the thread's status says "is thinking…"
        instead (and the tool running, an approval awaited), cleared at the end."""
        status = self._status()
        if status is None:
            yield
            return
        status.show(THINKING)
        try:
            yield
        finally:
            await status.clear()

    async def approve(self, request: ApprovalRequest) -> bool:
        client, clock = self._slack.client, self._slack.clock

        async def show(req: ApprovalRequest) -> PromptRef:
            response = await call_with_retry(
                lambda: slack_call(
                    client.chat_postMessage(
                        channel=self._channel_id,
                        thread_ts=self._thread_ts,
                        text=f"Approval needed: {escape(req.reason)}",
                        blocks=approval_blocks(req),
                    )
                ),
                clock=clock,
                what="slack approval prompt",
            )
            return PromptRef(self._channel_id, str(response["ts"]))

        status = self._status()
        if status is not None:
            status.show(APPROVAL)
        try:
            return await self._slack.approvals.request(request, show, self._slack.settle_prompt)
        finally:
            if status is not None and status.status == APPROVAL:
                status.show(THINKING)


async def start_thread(slack: SlackHost, channel_id: str, header: str) -> str:
    """Post `header` at the top level of `channel_id` as a responder posts (retried, 429s
    waited out, plain if the mrkdwn is refused); returns its ts, the thread's. The post
    remembers the thread as the bot's, so replies in it reach the agent unmentioned.
    Raises DeliveryFailed with Slack's reason if it cannot be posted."""
    posted = await deliver(SlackSurface(slack, channel_id, None), header, clock=slack.clock)
    if not posted:
        raise DeliveryFailed("an empty thread header is not posted")
    return posted[0]
