"""Who the bot answers on a platform (docs/channels.md#who-is-answered-the-gate): its own messages
never; other
bots only when they @mention it (or `ignore_bots = false`), pass the allowlists, stay
within a per-peer budget and the chain cap; only allowlisted users or channels; in group
channels, only when mentioned or in a thread it is part of.

Every refusal is logged at info with its reason (never the text), so an operator can
see why a message got no answer."""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from core.chat import Inbound
from core.clock import Clock, SystemClock

log = logging.getLogger(__name__)

BOT_PEER_WINDOW = 60.0
"""Seconds over which `bot_peer_budget` messages per bot are answered."""


class AccessConfig(BaseModel):
    """Who may talk to the bot on one platform (docs/channels.md#who-is-answered-the-gate). An
    empty allowlist admits
    nobody unless `open = true`; a message is admitted when its user is in
    `allow_users` or its channel/chat is in `allow_channels`.

    Each platform's settings (`[channels.<name>]`, in `channels/<name>_config.py`) extend it.
    Their validators are built once, inside the `[channels]` section's (`bot.config`), not
    each on its own when its class is defined (`defer_build`, docs/benchmarks.md).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    enabled: bool = False
    open: bool = Field(False, description="Admit everyone (allowlists ignored).")
    allow_users: list[str] = Field(default=[], description="Platform user ids.")
    allow_channels: list[str] = Field(
        default=[], description="Channel/chat ids whose members may talk to the bot."
    )
    approvers: list[str] = Field(
        default=[], description="User ids who may approve admin tool calls."
    )
    require_mention: bool = Field(
        True, description="In group channels answer only when mentioned or in the bot's thread."
    )
    ignore_bots: bool = Field(
        True, description="Answer another bot only when it @mentions Parley (false: always)."
    )
    max_bot_chain: int = Field(
        6,
        ge=1,
        description="After this many messages without a human author in a channel, answer "
        "no bot there until a human speaks.",
    )
    bot_peer_budget: int = Field(
        5, ge=0, description="Messages answered per allowed bot per minute (ping-pong guard)."
    )
    edit_interval_seconds: float = Field(
        1.0, ge=0.0, description="Least time between edits of one streamed message."
    )
    instructions: Path | None = Field(
        None,
        description="Instruction file for this platform's conversations (relative: to "
        "config.toml's folder); joins the system message.",
    )

    def admits(self, user_id: str, channel_id: str) -> bool:
        return self.open or user_id in self.allow_users or channel_id in self.allow_channels

    def who(self) -> str:
        """One line for start-up: who may talk to the bot here."""
        if self.open:
            return "everyone (open = true)"
        if not self.allow_users and not self.allow_channels:
            return "nobody (allow_users and allow_channels are empty)"
        parts = []
        if self.allow_users:
            parts.append("users " + ", ".join(self.allow_users))
        if self.allow_channels:
            parts.append("channels " + ", ".join(self.allow_channels))
        return "; ".join(parts)


class Gate:
    """Admission of inbound messages for one adapter."""

    def __init__(self, config: AccessConfig, clock: Clock | None = None) -> None:
        self._config = config
        self._clock = clock or SystemClock()
        self._bot_messages: dict[str, deque[float]] = {}
        # Messages without a human author since a human last spoke, per channel or chat.
        self._chain: dict[tuple[str, str], int] = {}

    def admit(
        self, inbound: Inbound, *, from_bot: bool, from_self: bool, in_bot_thread: bool = False
    ) -> bool:
        """True if the bot should answer `inbound`. Refusals are logged with the reason,
        never the text."""
        config = self._config
        if from_self:
            return self._refuse(inbound, "own message", logging.DEBUG)
        place = (inbound.channel, inbound.channel_id)
        if not from_bot:
            self._chain.pop(place, None)  # a human spoke: bots may be answered again
        elif not self._chain_open(place):
            return self._refuse(inbound, f"bot chain of {config.max_bot_chain} messages")
        if from_bot and config.ignore_bots and not inbound.mentions_bot:
            return self._refuse(inbound, "from a bot that does not mention Parley")
        if not config.admits(inbound.user_id, inbound.channel_id):
            return self._refuse(inbound, "user and channel not in the allowlists")
        if (
            not inbound.is_dm
            and config.require_mention
            and not (inbound.mentions_bot or in_bot_thread)
        ):
            return self._refuse(inbound, "group message without a mention")
        if from_bot and not self._bot_within_budget(inbound.user_id):
            return self._refuse(inbound, "bot peer budget spent")
        if from_bot:
            self._chain[place] = self._chain.get(place, 0) + 1  # Parley's answer adds one
        return True

    def _chain_open(self, place: tuple[str, str]) -> bool:
        """Count one bot message in `place`; False once `max_bot_chain` messages have gone
        by there without a human (Parley's own answers to bots count too)."""
        chain = self._chain.get(place, 0)
        self._chain[place] = chain + 1
        return chain < self._config.max_bot_chain

    def _bot_within_budget(self, bot_id: str) -> bool:
        """Count one message from bot `bot_id`; False once it has had its budget in the
        last minute (stops two bots answering each other forever)."""
        now = self._clock.monotonic()
        seen = self._bot_messages.setdefault(bot_id, deque())
        while seen and seen[0] <= now - BOT_PEER_WINDOW:
            seen.popleft()
        if len(seen) >= self._config.bot_peer_budget:
            return False
        seen.append(now)
        return True

    @staticmethod
    def _refuse(inbound: Inbound, reason: str, level: int = logging.INFO) -> bool:
        log.log(
            level,
            "ignoring %s message %s from %s in %s: %s",
            inbound.channel,
            inbound.event_id or inbound.message_id,
            inbound.user_id,
            inbound.channel_id,
            reason,
        )
        return False
