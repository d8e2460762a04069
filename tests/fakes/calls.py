"""What the fake platform servers share: the record of calls, waiting on it, and failure
injection.

Each fake keeps a `CallLog` as `self.log` and records every request it serves there::

    class FakeSlack(LogsCalls):
        def __init__(self) -> None:
            self.log = CallLog("Slack")

        async def _web_api(self, request: web.Request) -> web.Response:
            self.log.record(method, params, dict(request.headers))

`LogsCalls` gives tests the same inspecting and waiting API on every fake
(`fake.calls`, `calls_of`, `until` / `wait_until`, `wait_for`). Tests wait on
conditions, never on time: a wait re-checks after every recorded call and every
`log.notify()` (a fake calls it when other state a test may wait on changes), and a wait
that runs out raises `WaitTimeout`, an `AssertionError` that names the last calls.

`FailureQueue` keeps the failures a test injected with `fake.fail_next(...)`; the fake
shapes the error response the way its platform does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.clock import Clock

__all__ = ["Call", "CallLog", "Failure", "FailureQueue", "LogsCalls", "WaitTimeout"]


@dataclass(frozen=True, slots=True)
class Call:
    """One request a client made to a fake.

    Attributes:
        method: the platform's method name (`chat.update`, `edit_message`, `sendMessage`…).
        params: path parameters, query and body, decoded.
        headers: the request headers (empty for websocket traffic).
        at: when it was recorded, by the log's clock (`time.monotonic()` without one).
        status: the HTTP status the fake answered, where the fake records it (Telegram).
        result: the `result` the fake answered with, where recorded (None for errors).
    """

    method: str
    params: dict[str, Any]
    headers: dict[str, str]
    at: float
    status: int | None = None
    result: Any = None


Where = Callable[[Call], bool]


class WaitTimeout(AssertionError, TimeoutError):
    """A wait on a fake ran out. An `AssertionError`, so the test fails with the message;
    also a `TimeoutError`, for callers that catch the timeout to add their own."""


class CallLog:
    """The calls a fake served, in order, and a change signal to wait on."""

    def __init__(self, name: str, *, clock: Clock | None = None) -> None:
        self.name = name  # in timeout messages: "fake {name}: …"
        self.clock = clock  # stamps `Call.at`; None: time.monotonic
        self.calls: list[Call] = []
        self._changed = asyncio.Event()

    def record(
        self,
        method: str,
        params: dict[str, Any],
        headers: dict[str, str],
        status: int | None = None,
        result: Any = None,
    ) -> Call:
        """Append one call and wake every waiter."""
        at = self.clock.monotonic() if self.clock is not None else time.monotonic()
        call = Call(method, params, headers, at, status, result)
        self.calls.append(call)
        self.notify()
        return call

    def notify(self) -> None:
        """Wake every waiter to re-check its condition."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Return at the next `record` or `notify`."""
        await self._changed.wait()

    def last_calls(self, n: int = 15) -> str:
        """The last `n` calls, for a failure message."""
        shown = [c.method if c.status is None else f"{c.method} {c.status}" for c in self.calls]
        if not shown:
            return "none"
        return ("…, " if len(shown) > n else "") + ", ".join(shown[-n:])


class LogsCalls:
    """Mixin: the public inspecting and waiting API of a fake that keeps a `CallLog` as
    `self.log`."""

    log: CallLog

    @property
    def calls(self) -> list[Call]:
        """Every call so far, oldest first."""
        return self.log.calls

    def calls_of(self, method: str, where: Where | None = None) -> list[Call]:
        """The calls of `method` (matching `where`), oldest first."""
        return [c for c in self.calls if c.method == method and (where is None or where(c))]

    async def until(
        self,
        predicate: Callable[[], Any],
        timeout: float = 10.0,
        what: str | Callable[[], str] = "",
    ) -> Any:
        """Wait until `predicate()` is truthy and return its value. It is re-checked after
        every change; `what` names it in the `WaitTimeout` message."""
        try:
            async with asyncio.timeout(timeout):
                while not (result := predicate()):
                    await self.log.changed()
                return result
        except TimeoutError:
            label = (what() if callable(what) else what) or "condition"
            raise WaitTimeout(
                f"fake {self.log.name}: no {label} after {timeout}s; "
                f"last calls: {self.log.last_calls()}"
            ) from None

    wait_until = until

    async def wait_for(
        self, method: str, count: int = 1, timeout: float = 10.0, where: Where | None = None
    ) -> list[Call]:
        """Wait until at least `count` calls of `method` (matching `where`) were recorded;
        return them all."""
        await self.until(
            lambda: len(self.calls_of(method, where)) >= count,
            timeout,
            lambda: f"{count} × {method} (saw {len(self.calls_of(method, where))})",
        )
        return self.calls_of(method, where)


@dataclass
class Failure:
    """An injected failure: answer `times` more calls (whose params match `where`) with
    `status`; `retry_after` and `detail` (the error text) are for the fake to shape."""

    status: int
    retry_after: float | None = None
    detail: str | None = None
    where: Callable[[dict[str, Any]], bool] | None = None
    times: int = 1


class FailureQueue:
    """The failures injected per method, served first in, first out."""

    def __init__(self) -> None:
        self._queues: dict[str, list[Failure]] = {}

    def add(self, method: str, failure: Failure) -> None:
        self._queues.setdefault(method, []).append(failure)

    def take(self, method: str, params: dict[str, Any] | None = None) -> Failure | None:
        """The failure to answer this call of `method` with, if any (one use spent)."""
        queue = self._queues.get(method, [])
        for failure in queue:
            if failure.where is None or failure.where(params or {}):
                failure.times -= 1
                if failure.times <= 0:
                    queue.remove(failure)
                return failure
        return None
