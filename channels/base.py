"""The contract every chat adapter implements, and what they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Inbound:
    """One message from a platform, normalised."""

    channel: str
    channel_id: str
    thread_id: str
    user_id: str
    user_name: str
    text: str
    is_dm: bool = False
    mentions_bot: bool = False
    event_id: str = ""

    @property
    def conversation_key(self) -> tuple[str, str, str]:
        return (self.channel, self.channel_id, self.thread_id)


class Channel(Protocol):
    """A platform adapter: started and stopped by the application."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
