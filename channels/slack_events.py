"""Slack message events on their way to the agent: which events are someone writing (and
`!stop` typed as a command), the bounded memory that de-duplicates them, a message held
while it waits its turn, and the display names of the users it mentions (users.info)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from slack_sdk.web.async_client import AsyncWebClient

from channels.retry import call_with_retry
from channels.slack_api import failure_detail, slack_call
from core.chat import Inbound
from core.clock import Clock
from core.command_table import COMMANDS
from core.errors import ChannelError
from core.records import record

if TYPE_CHECKING:
    from channels.slack_reply import SlackResponder

log = logging.getLogger(__name__)

NAME_WAIT = 1.0  # seconds a message waits for the names of the users it mentions
HANDLED_SUBTYPES = frozenset({None, "bot_message", "thread_broadcast", "file_share", "me_message"})
_BANG_COMMAND = re.compile(r"^!([a-z]+)\b", re.IGNORECASE)


def command_text(text: str) -> str:
    """`!stop` (and `!compact …`) typed in a message is the command `/stop`."""
    match = _BANG_COMMAND.match(text)
    if match and match[1].lower() in COMMANDS:
        return "/" + text[1:]
    return text


class Recent:
    """A bounded set: remembers the last `size` keys."""

    def __init__(self, size: int) -> None:
        self._keys: OrderedDict[object, None] = OrderedDict()
        self._size = size

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: object) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def discard(self, key: object) -> None:
        self._keys.pop(key, None)


@record(frozen=True, slots=True)
class Taken:
    """A message event on its way to the agent."""

    inbound: Inbound
    responder: SlackResponder
    raw: str  # the text as Slack sent it
    unnamed: list[str]  # users it mentions whose names are not known yet
    before: asyncio.Future[None] | None  # the conversation's previous message, until submitted
    turn: asyncio.Future[None]  # done once this one is being submitted


class UserNames:
    """Display names of Slack users (users.info), kept for the adapter's lifetime: one
    lookup per user, however many messages wait for it."""

    def __init__(
        self,
        client: AsyncWebClient,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._client = client
        self._spawn = spawn  # the adapter's tracked tasks
        self._names: dict[str, str] = {}  # user id → display name
        self._lookups: dict[str, asyncio.Task[None]] = {}  # users.info under way, by user

    def __contains__(self, user_id: str) -> bool:
        return user_id in self._names

    def get(self, user_id: str) -> str | None:
        """The user's name, if known."""
        return self._names.get(user_id)

    def name_of(self, user_id: str) -> str:
        """The user's name, or their id while it is not known."""
        return self._names.get(user_id, user_id)

    async def learn(self, user_id: str) -> None:
        """Look up a user's display name, for their next message."""
        with contextlib.suppress(ChannelError):
            await self._fetch(user_id)

    async def learn_all(self, user_ids: list[str]) -> None:
        """Look up the names of users a message mentions; where that fails or takes over
        NAME_WAIT, the message names them by id (a late answer still fills the cache)."""
        lookups = []
        for user_id in user_ids:
            if (lookup := self._lookups.get(user_id)) is None:
                lookup = self._lookups[user_id] = self._spawn(self._try_fetch(user_id))
                lookup.add_done_callback(functools.partial(self._looked_up, user_id))
            lookups.append(lookup)
        _, late = await asyncio.wait(lookups, timeout=NAME_WAIT)
        if late:
            log.warning("slack: users.info took over %g s; naming users by id", NAME_WAIT)

    def _looked_up(self, user_id: str, lookup: asyncio.Task[None]) -> None:
        if self._lookups.get(user_id) is lookup:
            del self._lookups[user_id]

    async def _try_fetch(self, user_id: str) -> None:
        try:
            await self._fetch(user_id)
        except ChannelError as exc:
            detail = failure_detail(exc)
            log.warning("slack: users.info failed for %s (%s); naming them by id", user_id, detail)

    async def _fetch(self, user_id: str) -> str:
        info = await slack_call(self._client.users_info(user=user_id))
        user = info.get("user") or {}
        profile = user.get("profile") or {}
        name = str(
            profile.get("display_name") or profile.get("real_name") or user.get("name") or user_id
        )
        self._names[user_id] = name
        return name


async def react(client: AsyncWebClient, clock: Clock, channel_id: str, ts: str, name: str) -> None:
    """Add reaction `name` to message `ts` (a receipt: best effort)."""
    try:
        await call_with_retry(
            lambda: slack_call(client.reactions_add(channel=channel_id, timestamp=ts, name=name)),
            clock=clock,
            attempts=2,  # a receipt, not worth holding on to
            rate_limits=1,
            what="slack reactions.add",
        )
    except ChannelError as exc:
        log.debug("slack: no ack reaction (%s)", type(exc).__name__)
