"""A worker's proof that its runs are still its own (several workers, `core.agent.workers`).

Another worker takes a worker's runs over once it has not beaten for `timeout` seconds, by
the store's clock, deleting the silent worker's row in the same commit. So a worker that
beat at (its own monotonic) time t holds everything it held until t + `timeout`: nobody
can have taken it over before. That proof is `fresh`, with a margin for a platform call
already on its way when it runs out.

When the proof has run out — a long pause, SIGSTOP, an overloaded machine — a run asks
again before it speaks (`RunFence.holds`): the worker beats now. If its row was still
there, nothing was taken. If it was gone, the worker was taken for dead (the heartbeat
says so by listing it again): each of its runs is checked in the store at once, and the
ones another worker took are lost here: they are stopped, and nothing more is posted,
edited or deleted for them, nor written over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator

from core import metrics
from core.errors import StoreError
from core.store import SharedStore

log = logging.getLogger(__name__)

MARGIN = 0.25  # of `timeout`: what a platform call may take after the proof was checked
RETRY = 0.25  # seconds between heartbeats while one cannot get through


class RunFence:
    """`core.fence.Fence` of one run (or scheduled fire) of this worker."""

    def __init__(self, liveness: Liveness, key: str, still_mine: Callable[[], Awaitable[bool]]):
        self.liveness, self.key = liveness, key
        self._still_mine = still_mine
        self.incarnation = liveness.incarnation  # the worker's lapses seen so far
        self.lost = False
        self.users = 0
        self._on_lost: list[Callable[[], None]] = []

    async def holds(self, wait: float = 0.0, *, unsure: bool = False) -> bool:
        """`core.fence.Fence.holds`; `unsure` is the answer when it cannot be told (no
        heartbeat got through within `wait` seconds, the store could not be read)."""
        if self.lost:
            return False
        liveness = self.liveness
        if not liveness.fresh() and not await liveness.confirm(wait):
            return unsure and not self.lost
        if self.incarnation != liveness.incarnation:
            return await self.verify(unsure=unsure)
        return not self.lost

    async def verify(self, *, unsure: bool = False) -> bool:
        """After a lapse: whether the store still has the run as this worker's."""
        seen = self.liveness.incarnation
        try:
            mine = await self._still_mine()
        except StoreError:
            log.warning("could not check whether %s is still this worker's", self.key)
            return unsure
        if not mine:
            self.lose()
            return False
        self.incarnation = max(self.incarnation, seen)
        return not self.lost

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the run is found lost."""
        if self.lost:
            callback()
        else:
            self._on_lost.append(callback)

    def lose(self) -> None:
        if self.lost:
            return
        self.lost = True
        log.warning(
            "%s was taken over by another worker: nothing more is done for it here", self.key
        )
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("stopping lost %s failed", self.key)


class Liveness:
    """One worker's heartbeats, and the fences of what it holds."""

    def __init__(self, store: SharedStore, worker_id: str, timeout: float) -> None:
        self.store, self.worker_id, self.timeout = store, worker_id, timeout
        self.alive_until = -math.inf  # monotonic: until then nobody can have taken over
        self.incarnation = 0  # times this worker found it was taken for dead
        self.joined = False
        self._beating: asyncio.Future[None] | None = None
        self._fences: dict[str, RunFence] = {}

    def fresh(self) -> bool:
        """The last heartbeat proves that nothing of this worker was taken over."""
        return time.monotonic() < self.alive_until

    async def beat(self) -> None:
        """One heartbeat (joining the one in flight, if any). Raises StoreError."""
        if self._beating is None or self._beating.done():
            self._beating = asyncio.ensure_future(self._beat())
        await asyncio.shield(self._beating)

    async def _beat(self) -> None:
        sent = time.monotonic()
        try:
            kept = await self.store.worker_heartbeat(self.worker_id)
        except Exception:
            metrics.heartbeat(False)
            raise
        metrics.heartbeat(True)
        if not kept and self.joined:
            self.incarnation += 1
            log.warning(
                "worker %s was silent too long and taken for dead: checking its runs",
                self.worker_id,
            )
            await self._check_all()
        self.joined = True
        self.alive_until = sent + self.timeout * (1 - MARGIN)

    async def _check_all(self) -> None:
        """Stop at once what was taken over while this worker was silent."""
        for fence in list(self._fences.values()):
            await fence.verify(unsure=True)

    async def confirm(self, wait: float = 0.0) -> bool:
        """Beat now, and again for up to `wait` seconds while the store cannot be reached;
        whether the proof is fresh again."""
        deadline = time.monotonic() + wait
        while True:
            with contextlib.suppress(StoreError):
                await self.beat()
            if self.fresh():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(RETRY)

    @contextlib.contextmanager
    def holding(self, key: str, still_mine: Callable[[], Awaitable[bool]]) -> Iterator[RunFence]:
        """The fence of `key` while inside (one per key, shared by whoever holds it)."""
        fence = self._fences.get(key)
        if fence is None:
            fence = self._fences[key] = RunFence(self, key, still_mine)
        fence.users += 1
        try:
            yield fence
        finally:
            fence.users -= 1
            if fence.users == 0 and self._fences.get(key) is fence:
                del self._fences[key]


__all__ = ["Liveness", "RunFence"]
