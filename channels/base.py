"""The contract every chat adapter implements, and what they share (docs/channels.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from core.chat import AgentPort, ConversationKey, Inbound, Responder

if TYPE_CHECKING:
    from core.lease import Singleton

__all__ = ["Channel", "Inbound", "ThreadOpener"]


class Channel(Protocol):
    """A platform adapter, started and stopped by the application.

    `name` is the channel type used in conversation keys and job targets
    (`telegram`, `slack`, `discord`, `console`).
    """

    name: str

    async def start(self, agent: AgentPort) -> None:
        """Connect and begin handing inbound messages to `agent.submit`. A platform event
        is acknowledged (ack, offset, HTTP 200) only after `submit` returned for it: a
        crash before that leaves it with the platform, which delivers it again."""

    async def stop(self) -> None:
        """Stop taking input and close connections."""

    def responder(self, key: ConversationKey) -> Responder:
        """Where to post into conversation `key` without an inbound message (cron reports,
        resume notices)."""

    def access(self) -> str:
        """Who may talk to the bot here, for the start-up banner."""

    def singletons(self) -> list[Singleton]:
        """The connections only one worker may hold at a time (Telegram's long poll, each
        Discord gateway shard), for the caller to run under leases when several workers
        share the store; called before `start`, which then leaves them out. Most
        channels have none."""


@runtime_checkable
class ThreadOpener(Protocol):
    """A channel that can start a thread of its own (not the console)."""

    async def open_thread(self, channel_id: str, header: str) -> str:
        """Post `header` in `channel_id` as the start of a new thread (a trigger's,
        docs/triggers.md#one-thread-per-key); the thread part of the conversation key
        that posts into it and that people's replies in it have: Slack the header's `ts`,
        Discord the id of the thread started on the header, Telegram `r<header's message
        id>` (its posts reply to the header). Raises DeliveryFailed if it cannot be
        posted."""
