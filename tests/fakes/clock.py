"""A clock for tests: sleeps return at once and advance time."""

from __future__ import annotations

import asyncio


class FakeClock:
    """A clock whose sleeps return at once and advance time; `sleeps` records each one."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class ManualClock:
    """A clock that moves only when the test calls `advance`: sleepers wake once their
    time has come, so a test steps a schedule (renewals, retries) one tick at a time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        entry = (self.now + seconds, asyncio.get_running_loop().create_future())
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        self._sleepers.append(entry)
        try:
            await entry[1]
        finally:
            self._sleepers.remove(entry)

    def wake_times(self) -> list[float]:
        """When the waiting sleeps are due, earliest first. A sleep whose task was
        cancelled is not waiting, although it stays listed until that task runs again
        (a holder seemed settled on a cancelled renewal before it had released)."""
        return sorted(wake_at for wake_at, future in self._sleepers if not future.done())

    def advance(self, seconds: float) -> None:
        """Move time on and wake the sleeps that are due."""
        self.now += seconds
        for wake_at, future in list(self._sleepers):
            if wake_at <= self.now and not future.done():
                future.set_result(None)
