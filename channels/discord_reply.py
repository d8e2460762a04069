"""Where the bot's output goes in Discord: a channel, thread or DM as a `Surface` for the
reply streamer (final text formatted for Discord, plain if refused), the `Responder` of
one conversation, sharing its channel's edit budget, with its typing indicator, and the
thread a trigger's header starts (`start_thread`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from channels.discord_api import discord_call
from channels.discord_config import DiscordConfig
from channels.retry import call_with_retry
from channels.stream import EditBudget, ReplyStreamer, Typing, deliver
from channels.text import bold_deep_headings, to_discord
from core.chat import ApprovalRequest, PreviewStream
from core.clock import Clock
from core.errors import ChannelError, ChannelRefused, DeliveryFailed
from core.secrets import scrub

with warnings.catch_warnings():
    # discord.py imports `audioop` (voice support), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord


class DiscordHost(Protocol):
    """What a responder uses of its channel (`channels.discord.DiscordChannel`)."""

    clock: Clock
    config: DiscordConfig

    def client(self) -> discord.Client: ...

    def edit_budget(self, channel_id: int) -> EditBudget: ...

    async def ask_approval(self, target: int, request: ApprovalRequest) -> bool: ...


MESSAGE_LIMIT = 2000
TYPING_INTERVAL = 8.0  # the indicator lasts 10 s
THREAD_NAME_LIMIT = 100  # characters; Discord refuses longer thread names
THREAD_ARCHIVE_MINUTES: Literal[1440] = 1440  # hidden a day after its last post


class DiscordSurface:
    """One Discord channel, thread or DM as a `channels.stream.Surface`."""

    limit = MESSAGE_LIMIT

    def __init__(self, channel: Callable[[], discord.PartialMessageable]) -> None:
        self._resolve = channel

    @property
    def _channel(self) -> discord.PartialMessageable:
        try:
            return self._resolve()
        except ChannelError as exc:  # stopped: a post now is simply not delivered
            raise DeliveryFailed(str(exc)) from exc

    def measure(self, text: str) -> int:
        return len(text)

    async def post(self, text: str, *, final: bool) -> str:
        content = to_discord(text) if final else bold_deep_headings(text)
        try:
            message = await discord_call(self._channel.send(content))
        except ChannelRefused:
            if content == text:
                raise
            message = await discord_call(self._channel.send(text))  # plain fallback
        return str(message.id)

    async def edit(self, message_id: str, text: str, *, final: bool) -> None:
        content = to_discord(text) if final else bold_deep_headings(text)
        partial = self._channel.get_partial_message(int(message_id))
        try:
            await discord_call(partial.edit(content=content))
        except ChannelRefused:
            if content == text:
                raise
            await discord_call(partial.edit(content=text))

    async def delete(self, message_id: str) -> None:
        try:
            await discord_call(self._channel.get_partial_message(int(message_id)).delete())
        except ChannelRefused as exc:
            if exc.status != 404:  # already gone is fine
                raise


class DiscordResponder:
    """Posts into one Discord channel, thread or DM (`core.chat.Responder`)."""

    def __init__(self, adapter: DiscordHost, target: int) -> None:
        self._adapter, self._target = adapter, target

    def _surface(self) -> DiscordSurface:
        adapter, target = self._adapter, self._target
        return DiscordSurface(lambda: adapter.client().get_partial_messageable(target))

    async def send(self, text: str) -> None:
        await deliver(self._surface(), text, clock=self._adapter.clock)

    def stream(self) -> PreviewStream:
        adapter = self._adapter
        return ReplyStreamer(
            self._surface(),
            clock=adapter.clock,
            min_interval=adapter.config.edit_interval_seconds,
            budget=adapter.edit_budget(self._target),
            typing=self._send_typing,
            status_lines=True,  # a tool step or a compaction: one line under the preview
            status_alone=True,  # …or a message of its own until text comes (no blank wait)
            repost_over=adapter.config.repost_final_over,
        )

    async def approve(self, request: ApprovalRequest) -> bool:
        return await self._adapter.ask_approval(self._target, request)

    def typing(self) -> AbstractAsyncContextManager[None]:
        return Typing(self._send_typing, interval=TYPING_INTERVAL, clock=self._adapter.clock)

    async def _send_typing(self) -> None:
        await discord_call(self._adapter.client().http.send_typing(self._target))


async def start_thread(adapter: DiscordHost, channel_id: str, header: str) -> str:
    """Post `header` in `channel_id` as a responder posts (retried, 429s waited out), start
    a public thread on it named after it, and return the thread's id. Raises
    DeliveryFailed with Discord's reason if either is refused (a header without its
    thread stays posted)."""
    try:
        target = int(channel_id)
    except ValueError:
        raise DeliveryFailed(f"not a Discord channel id: {channel_id!r}") from None
    surface = DiscordSurface(lambda: adapter.client().get_partial_messageable(target))
    posted = await deliver(surface, header, clock=adapter.clock)
    if not posted:
        raise DeliveryFailed("an empty thread header is not posted")
    # The REST call, not `Message.create_thread`: that needs the guild in the client's
    # cache, which a worker without a gateway shard (REST only) does not have.
    try:
        thread = await call_with_retry(
            lambda: discord_call(
                adapter.client().http.start_thread_with_message(
                    target,
                    int(posted[0]),
                    name=thread_name(header),
                    auto_archive_duration=THREAD_ARCHIVE_MINUTES,
                )
            ),
            clock=adapter.clock,
            what="Discord start thread",
        )
    except ChannelError as exc:
        raise DeliveryFailed(f"Discord could not start a thread on the header: {exc}") from exc
    return str(thread["id"])


def thread_name(header: str) -> str:
    """A thread's name from its header: one line, no secrets, cut to Discord's limit."""
    name = " ".join(scrub(header).split())
    return name if len(name) <= THREAD_NAME_LIMIT else name[: THREAD_NAME_LIMIT - 1] + "…"
