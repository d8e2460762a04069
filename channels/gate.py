"""Who the bot answers on a platform (SPEC §9, §13): its own messages never; other
bots only when allowed and then within a per-peer budget; only allowlisted users or
channels; in group channels, only when mentioned or in a thread it is part of."""

from __future__ import annotations

import logging
from collections import deque

from core.chat import Inbound
from core.clock import Clock, SystemClock
from core.config import AccessConfig

log = logging.getLogger(__name__)

BOT_PEER_WINDOW = 60.0
"""Seconds over which `bot_peer_budget` messages per bot are answered."""


class Gate:
    """Admission of inbound messages for one adapter."""

    def __init__(self, config: AccessConfig, clock: Clock | None = None) -> None:
        self._config = config
        self._clock = clock or SystemClock()
        self._bot_messages: dict[str, deque[float]] = {}

    def admit(
        self, inbound: Inbound, *, from_bot: bool, from_self: bool, in_bot_thread: bool = False
    ) -> bool:
        """True if the bot should answer `inbound`. Refusals are logged (debug) with the
        reason, never the text."""
        config = self._config
        if from_self:
            return self._refuse(inbound, "own message")
        if from_bot and config.ignore_bots:
            return self._refuse(inbound, "from a bot (ignore_bots)")
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
        return True

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
    def _refuse(inbound: Inbound, reason: str) -> bool:
        log.debug(
            "ignoring %s message %s from %s in %s: %s",
            inbound.channel,
            inbound.event_id or inbound.message_id,
            inbound.user_id,
            inbound.channel_id,
            reason,
        )
        return False
