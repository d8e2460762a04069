"""Notices to the dispatcher (docs/durability.md, docs/scale-out.md): in one process an
in-process event (`LocalNotices`); between workers on one store PostgreSQL's `LISTEN/NOTIFY`.

A notice is a topic and a short payload (a run or conversation id). `publish` sends it
through the store's group commit, so it is delivered when what was queued before it is
committed (PostgreSQL delivers a `NOTIFY` at commit) and never before. Each worker keeps
one connection of its own that `LISTEN`s (psycopg 3, autocommit, `notifies()`); it
reconnects when the server goes away, and says so (`on_listening`), since notices sent
meanwhile are lost: the listener's owner then looks at the store itself.

The channel name is derived from the database and schema, so stores in different schemas
of one database (tests, or two bots) never hear each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from core.errors import ConfigError
from core.store.protocol import Store

if TYPE_CHECKING:
    from core.store.postgres import PostgresStore

log = logging.getLogger(__name__)

Handler = Callable[[str, str], None]
"""Called with (topic, payload) for each notice, in the listener's task: it must not block."""

_RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)


class Notices(Protocol):
    """Publish notices to every worker on the store, and listen to them."""

    async def publish(self, topic: str, payload: str = "") -> None:
        """Committed with everything queued on the store before it, then delivered to
        every listener (this worker's too)."""
        ...

    def publish_soon(self, topic: str, payload: str = "") -> None:
        """Queued with the store's next group commit; delivered when it commits."""
        ...

    async def listen(self, handler: Handler, on_listening: Callable[[], None]) -> None:
        """Deliver notices to `handler` until cancelled; `on_listening` is called each
        time listening (re)starts — notices sent before that were not heard."""
        ...


class LocalNotices:
    """`Notices` within one process (one store that no other process claims from): a
    notice is handed to the listeners on the event loop's next turn, with no store and no
    polling in between. What it announces (a queued run, a run that ended) is committed
    before it is published, or is claimed by a statement that commits after it."""

    def __init__(self) -> None:
        self._handlers: list[Handler] = []

    async def publish(self, topic: str, payload: str = "") -> None:
        self.publish_soon(topic, payload)

    def publish_soon(self, topic: str, payload: str = "") -> None:
        loop = asyncio.get_running_loop()
        for handler in self._handlers:
            loop.call_soon(_deliver, handler, topic, payload)

    async def listen(self, handler: Handler, on_listening: Callable[[], None]) -> None:
        self._handlers.append(handler)
        try:
            on_listening()
            await asyncio.Future()  # until cancelled
        finally:
            self._handlers.remove(handler)


def _deliver(handler: Handler, topic: str, payload: str) -> None:
    try:
        handler(topic, payload)
    except Exception:
        log.exception("notice %s:%s was not handled", topic, payload)


async def open_notices(store: Store) -> Notices:
    """The notices of `store`.

    Raises:
        ConfigError: the store's backend has none (only PostgreSQL has; several workers
            need it).
    """
    try:
        from core.store.postgres import PostgresStore
    except ImportError:  # no psycopg: this cannot be a PostgreSQL store
        PostgresStore = None  # type: ignore[assignment,misc]
    if PostgresStore is None or not isinstance(store, PostgresStore):
        raise ConfigError(
            "store.url",
            "several workers need PostgreSQL's LISTEN/NOTIFY, and this store is not PostgreSQL",
            'set `url = "postgresql://USER@HOST:5432/DATABASE"` in [store], or run one worker',
        )
    where = await store.location()
    return PostgresNotices(store, "parley_" + hashlib.sha256(where.encode()).hexdigest()[:16])


class PostgresNotices:
    """`Notices` on PostgreSQL: `pg_notify` through the store, `LISTEN` on a connection
    of its own."""

    def __init__(self, store: PostgresStore, channel: str) -> None:
        self._store = store
        self.channel = channel

    async def publish(self, topic: str, payload: str = "") -> None:
        await self._store.write("SELECT pg_notify(%s, %s)", (self.channel, f"{topic}:{payload}"))

    def publish_soon(self, topic: str, payload: str = "") -> None:
        self._store.write_soon("SELECT pg_notify(%s, %s)", (self.channel, f"{topic}:{payload}"))

    async def listen(self, handler: Handler, on_listening: Callable[[], None]) -> None:
        import psycopg
        from psycopg import sql

        failures = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._store.url, **self._store.connect_kwargs
                )
            except psycopg.Error as exc:
                delay = _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
                failures += 1
                log.warning("notice listener cannot connect (%s); again in %s s", exc, delay)
                await asyncio.sleep(delay)
                continue
            try:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                failures = 0
                on_listening()
                async for note in conn.notifies():
                    topic, _, payload = note.payload.partition(":")
                    try:
                        handler(topic, payload)
                    except Exception:
                        log.exception("notice %s:%s was not handled", topic, payload)
            except psycopg.Error as exc:
                log.warning("notice listener lost its connection (%s); reconnecting", exc)
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()


__all__ = ["Handler", "LocalNotices", "Notices", "PostgresNotices", "open_notices"]
