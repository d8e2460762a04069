"""Each channel's provider preference (`/provider`), kept in memory between turns.

Every turn asks which provider its channel wants. The answer is read from the store once
per channel and kept; `/provider` here writes the new one through. With several workers on
one store, the worker that ran `/provider` announces the change (the `conv` notice every
conversation-changing command sends, delivered once the new preference is committed), and
the other workers forget what they kept for that channel; a worker that (re)starts
listening forgets everything, since the notices sent meanwhile were lost. On SQLite one
process serves the store, so what it keeps is what the store holds.
"""

from __future__ import annotations

from core.agent.conversation import ConversationFactory
from core.store import Store

MAX_KEPT = 10_000  # channels (DMs count) kept; past it the memory starts over


class ProviderPrefs:
    """The provider each channel uses: its stored preference while that provider is
    configured, else the default."""

    def __init__(self, store: Store, factory: ConversationFactory) -> None:
        self._store, self._factory = store, factory
        self._kept: dict[tuple[str, str], str | None] = {}
        self._forgets = 0  # a read that overlaps a forget may be stale: it is not kept

    async def provider_for(self, channel: str, channel_id: str) -> str:
        """The provider of `channel_id` on `channel`, silently the default when the one
        it chose is no longer configured."""
        stored = await self._stored(channel, channel_id)
        if stored is not None and stored in self._factory.provider_names():
            return stored
        return self._factory.default_provider

    async def choose(self, channel: str, channel_id: str, provider: str) -> None:
        """`/provider NAME`: stored, and used from the channel's next run on."""
        await self._store.set_provider_pref(channel, channel_id, provider)
        self.forget(channel, channel_id)
        self._kept[(channel, channel_id)] = provider

    def forget(self, channel: str, channel_id: str) -> None:
        """Another worker may have changed this channel's preference: read it again."""
        self._forgets += 1
        self._kept.pop((channel, channel_id), None)

    def forget_all(self) -> None:
        """Changes may have been missed (notices lost while not listening): read every
        channel's choice again."""
        self._forgets += 1
        self._kept.clear()

    async def _stored(self, channel: str, channel_id: str) -> str | None:
        where = (channel, channel_id)
        if where in self._kept:
            return self._kept[where]
        forgets = self._forgets
        stored = await self._store.provider_pref(channel, channel_id)
        if forgets == self._forgets:
            if len(self._kept) >= MAX_KEPT:
                self._kept.clear()
            self._kept[where] = stored
        return stored


__all__ = ["ProviderPrefs"]
