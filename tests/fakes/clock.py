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
