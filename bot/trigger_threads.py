"""The platform threads of trigger conversations (docs/triggers.md#one-thread-per-key), the
`core.agent.agent.Threads` the application gives the agent.

A trigger conversation (`trigger:NAME:<id>`) posts into one platform thread: its first
post opens it — the header line in the trigger's channel (`Channel.open_thread`) — and
the store records the thread and the conversation key people's replies in it have
(`set_platform_thread`), so that any worker, later, posts there too and routes those
replies to the trigger's conversation. A worker killed between the header and that record
leaves a thread nobody posts into again; the next post opens another (said in the docs).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from channels.base import ThreadOpener
from core.chat import ConversationKey, Inbound, Responder

if TYPE_CHECKING:
    from channels.base import Channel
    from core.eventlog import EventLog
    from core.store import Store

KNOWN_CAP = 10_000  # places remembered (either way) per process


class TriggerThreads:
    """Opens and finds the platform threads of trigger conversations for one process."""

    def __init__(self, store: Store, channels: Mapping[str, Channel], events: EventLog) -> None:
        self.store, self.channels, self.events = store, channels, events
        self._places: dict[str, ConversationKey] = {}  # trigger conversation → its thread
        # a platform thread's key → its trigger conversation, or None for none; a thread's
        # key exists only once its header is posted, so a None stays true
        self._routes: OrderedDict[str, str | None] = OrderedDict()

    async def responder(self, key: ConversationKey) -> Responder | None:
        conv = ":".join(key)
        place = self._places.get(conv) or await self._open(conv)
        if place is None:
            return None
        return self.channels[place[0]].responder(place)

    async def _open(self, conv: str) -> ConversationKey | None:
        row = await self.store.platform_thread(conv)
        if row is None:
            return None
        kind, _, channel_id = row.place.partition(":")
        channel = self.channels.get(kind)
        if channel is None:
            return None
        thread = row.thread
        if thread is None:
            if not isinstance(channel, ThreadOpener):
                return None
            thread = await channel.open_thread(channel_id, row.header)
            alias = f"{kind}:{channel_id}:{thread}"
            await self.store.set_platform_thread(conv, thread, alias)
            self._remember(alias, conv)
            self.events.emit(
                "trigger.thread.opened", {"place": row.place, "thread": thread}, conv=conv
            )
        place = (kind, channel_id, thread)
        self._places[conv] = place
        if len(self._places) > KNOWN_CAP:
            self._places.pop(next(iter(self._places)))
        return place

    async def routed(self, inbound: Inbound) -> ConversationKey | None:
        for thread in _threads_of(inbound):
            alias = f"{inbound.channel}:{inbound.channel_id}:{thread}"
            if alias in self._routes:
                conv = self._routes[alias]
            else:
                conv = await self.store.conversation_alias(alias)
                self._remember(alias, conv)
            if conv is not None:
                kind, name, ident = conv.split(":", 2)
                return (kind, name, ident)
        return None

    def _remember(self, alias: str, conv: str | None) -> None:
        self._routes[alias] = conv
        if len(self._routes) > KNOWN_CAP:
            self._routes.popitem(last=False)


def _threads_of(inbound: Inbound) -> list[str]:
    """The thread parts a message's place may have: its platform thread, or (Telegram)
    `r<id>` of the message it replies to."""
    found = [inbound.thread_id] if inbound.thread_id else []
    if inbound.reply_to:
        found.append(f"r{inbound.reply_to}")
    return found


__all__ = ["TriggerThreads"]
