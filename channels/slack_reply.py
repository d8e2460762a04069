"""Where the bot's output goes in Slack: a `Surface` for the reply streamer (one thread,
DM or channel top level) and the `Responder` of one conversation, with its approval
prompts and the `response_url` fallback for slash commands."""

from __future__ import annotations

import contextlib
from typing import Protocol

from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from channels.approvals import Approvals
from channels.retry import call_with_retry
from channels.slack_api import LIMIT_BYTES, escape, slack_call, slack_size
from channels.slack_blocks import approval_blocks
from channels.slack_config import SlackConfig
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

    def remember_thread(self, channel_id: str, thread_ts: str) -> None: ...

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
    ) -> None:
        self._slack, self._channel_id, self._thread_ts = slack, channel_id, thread_ts
        self._response_url = response_url

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

    def stream(self) -> PreviewStream:
        return ReplyStreamer(
            self._surface(),
            clock=self._slack.clock,
            min_interval=self._slack.config.edit_interval_seconds,
        )

    def typing(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

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

        return await self._slack.approvals.request(request, show, self._slack.settle_prompt)
