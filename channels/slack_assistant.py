"""Slack's AI-app surfaces (docs/channels.md#slack-assistant-threads): the assistant
threads of an app with the Agents & AI Apps feature, and the status shown under any thread.

- `assistant_thread_started`: someone opened the assistant pane; the configured suggested
  prompts are offered (`assistant.threads.setSuggestedPrompts`).
- `assistant_thread_context_changed`: the channel they look at changed; it is remembered,
  and their next message in that thread says so in a line of its own, so "this channel"
  means something to the model.
- The first message of an assistant thread titles it (`assistant.threads.setTitle`).
- `ThreadStatus` per thread (`assistant.threads.setStatus`), shared by its responders.

Bolt's `Assistant` middleware is not used: it takes the thread's `message` events for
itself, and those must reach the adapter's one path (stored before acknowledged).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.slack_api import slack_call
from channels.slack_config import SlackConfig
from channels.slack_status import ThreadStatus
from core.clock import Clock
from core.errors import ChannelError

log = logging.getLogger(__name__)

TITLE_CHARS = 60
KEPT = 2048  # assistant threads (and idle statuses) remembered


class AssistantThreads:
    """Assistant threads this process saw open, what their users look at, their statuses."""

    def __init__(self, client: AsyncWebClient, config: SlackConfig, clock: Clock) -> None:
        self._client, self._config, self._clock = client, config, clock
        self._threads: OrderedDict[tuple[str, str], str] = OrderedDict()  # → context channel
        self._titled: set[tuple[str, str]] = set()
        self._statuses: OrderedDict[tuple[str, str], ThreadStatus] = OrderedDict()

    def status(self, channel_id: str, thread_ts: str) -> ThreadStatus:
        key = (channel_id, thread_ts)
        status = self._statuses.get(key)
        if status is None:
            status = self._statuses[key] = ThreadStatus(
                lambda text: slack_call(
                    self._client.assistant_threads_setStatus(
                        channel_id=channel_id, thread_ts=thread_ts, status=text
                    )
                ),
                self._clock,
                refresh=self._config.status_refresh_seconds,
            )
            self._prune()
        return status

    def _prune(self) -> None:
        while len(self._statuses) > KEPT:
            key, oldest = next(iter(self._statuses.items()))
            if oldest.status:  # still showing: keep it (and everything newer)
                break
            del self._statuses[key]

    async def started(self, event: dict[str, Any]) -> None:
        """`assistant_thread_started`: offer the suggested prompts."""
        if (thread := self._remember(event)) is None:
            return
        channel_id, thread_ts = thread
        prompts = [p.model_dump() for p in self._config.suggested_prompts]
        if not prompts:
            return
        try:
            await slack_call(
                self._client.assistant_threads_setSuggestedPrompts(
                    channel_id=channel_id, thread_ts=thread_ts, prompts=prompts
                )
            )
        except ChannelError as exc:
            log.info("slack: suggested prompts not shown: %s", exc)

    def context_changed(self, event: dict[str, Any]) -> None:
        """`assistant_thread_context_changed`: remember what the user looks at now."""
        self._remember(event)

    def _remember(self, event: dict[str, Any]) -> tuple[str, str] | None:
        """The event's assistant thread (channel, thread ts) and what its user looks at,
        remembered; None if the event names no thread."""
        thread = event.get("assistant_thread") or {}
        key = (str(thread.get("channel_id", "")), str(thread.get("thread_ts", "")))
        if not all(key):
            return None
        context = thread.get("context") or {}
        self._threads[key] = str(context.get("channel_id") or "")
        self._threads.move_to_end(key)
        while len(self._threads) > KEPT:
            old, _ = self._threads.popitem(last=False)
            self._titled.discard(old)
        return key

    def is_assistant_thread(self, channel_id: str, thread_ts: str) -> bool:
        return (channel_id, thread_ts) in self._threads

    def context_line(self, channel_id: str, thread_ts: str) -> str:
        """The line that tells the model which channel the user is looking at, or ""."""
        viewing = self._threads.get((channel_id, thread_ts), "")
        return f"(I am looking at <#{viewing}>.)" if viewing else ""

    async def title(self, channel_id: str, thread_ts: str, text: str) -> None:
        """Title an assistant thread after its first message (once)."""
        key = (channel_id, thread_ts)
        if key not in self._threads or key in self._titled:
            return
        self._titled.add(key)
        line = " ".join(text.split())
        title = line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"
        try:
            await slack_call(
                self._client.assistant_threads_setTitle(
                    channel_id=channel_id, thread_ts=thread_ts, title=title
                )
            )
        except ChannelError as exc:
            log.info("slack: thread title not set: %s", exc)
