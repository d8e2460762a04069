"""Slack user groups of a user, for roles that name them (docs/governance.md#roles).

One `usergroups.list` call (with `include_users`) gives every group and its members; the
answer is kept for `TTL` seconds, and one call at a time is made however many messages
wait on it. A failed lookup gives no groups (the person then has only the roles that
name them directly, or the default role) and is tried again on the next message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.slack_api import slack_call
from core.clock import Clock
from core.errors import ChannelError

log = logging.getLogger(__name__)

TTL = 300.0  # seconds a group list is used before it is fetched again


class UserGroups:
    """User id → the ids of the Slack user groups they are in."""

    def __init__(self, client: AsyncWebClient, clock: Clock) -> None:
        self._client, self._clock = client, clock
        self._members: dict[str, tuple[str, ...]] = {}
        self._fetched_at: float | None = None
        self._fetching: asyncio.Task[None] | None = None

    async def of(self, user_id: str) -> tuple[str, ...]:
        now = self._clock.monotonic()
        if self._fetched_at is None or now - self._fetched_at > TTL:
            if self._fetching is None or self._fetching.done():
                self._fetching = asyncio.ensure_future(self._fetch())
            await asyncio.shield(self._fetching)
        return self._members.get(user_id, ())

    async def _fetch(self) -> None:
        try:
            answer: Any = await slack_call(self._client.usergroups_list(include_users=True))
        except ChannelError as exc:
            log.warning("slack: usergroups.list failed (%s); no groups this time", exc)
            return
        members: dict[str, list[str]] = {}
        for group in answer.get("usergroups") or []:
            for user in group.get("users") or []:
                members.setdefault(str(user), []).append(str(group.get("id", "")))
        self._members = {user: tuple(ids) for user, ids in members.items()}
        self._fetched_at = self._clock.monotonic()
