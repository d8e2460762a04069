"""Leased singletons in `parley run` (docs/scale-out.md): on a store several workers share
(PostgreSQL), the connections only one worker may hold — Telegram long polling, each
Discord gateway shard — and the job scheduler run under a lease (`core.lease`), so one
worker holds each and another takes it over within about `[store] lease_seconds` when it
dies. On SQLite one process holds everything, as it always did: nothing here runs.

Channels offer their singletons with `singletons()` (called before `start`, which then
leaves them out); Slack has none: Socket Mode allows several connections per app, and
HTTP mode sits behind a load balancer like a Telegram webhook.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from core.lease import LeaseHolder, LeaseStore, Singleton

if TYPE_CHECKING:
    from bot.jobs import Scheduler
    from channels.base import Channel
    from core.eventlog import EventLog
    from core.events import EventName

TAKEOVER_SPANS = 3  # a successor catches up every cron fire of the last 3 lease times


def worker_id() -> str:
    """This process among the workers: host, pid and a random part (pids repeat)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def channel_singletons(channels: Mapping[str, Channel]) -> list[Singleton]:
    """What the channels leave to leases; call before starting them."""
    found: list[Singleton] = []
    for channel in channels.values():
        found.extend(channel.singletons())
    return found


def scheduler_singleton(scheduler: Scheduler, lease_seconds: float) -> Singleton:
    """The job scheduler as a singleton; a successor catches up the fires a dead holder
    missed (each fire is claimed once in the store, whoever fires it)."""
    return Singleton("scheduler", lambda: scheduler.hold(TAKEOVER_SPANS * lease_seconds))


class Singletons:
    """The lease holders of one worker: started once the channels are, stopped first at
    shutdown (each stops its singleton and releases its lease)."""

    def __init__(
        self,
        store: LeaseStore,
        singletons: Iterable[Singleton],
        *,
        worker: str,
        lease_seconds: float,
        events: EventLog,
        out: TextIO,
    ) -> None:
        self.worker, self._events, self._out = worker, events, out
        self.holders = [
            LeaseHolder(store, s.name, worker, s.run, ttl=lease_seconds, emit=self._emit)
            for s in singletons
        ]
        self._tasks: list[asyncio.Task[None]] = []

    def names(self) -> list[str]:
        return [holder.name for holder in self.holders]

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(holder.run(), name=f"lease holder {holder.name}")
            for holder in self.holders
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _emit(self, name: EventName, data: dict[str, Any]) -> None:
        self._events.emit(name, data)
        what = name.removeprefix("lease.")
        why = f" ({data['why']})" if name == "lease.lost" else ""
        self._out.write(f"parley: lease {data['lease']} {what}{why}\n")
        self._out.flush()
