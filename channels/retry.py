"""The one retry rule for platform calls, used by every adapter and the reply streamer.

An adapter maps its SDK's failures onto `core.errors` at its edge; this helper reads only
the tree: a `ChannelRateLimited` is waited out for its `retry_after` on the injected clock,
a `ChannelUnavailable` is tried again after a growing backoff, and anything else — above
all a `ChannelRefused` — is raised at once, since asking again would get the same answer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from core import metrics, tracing
from core.clock import Clock
from core.errors import ChannelError, ChannelRateLimited, ChannelUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

BACKOFF = (0.5, 1.0, 2.0, 4.0)
"""Waits between tries while the platform is unavailable (the last one repeats)."""
ATTEMPTS = len(BACKOFF) + 1
"""Tries in all while the platform is unavailable (five)."""
MAX_RATE_LIMITS = 10
"""429s one call waits out before it is given up."""
HEALTH: dict[str, bool] = {}
"""Per platform, whether its last API call got an answer (False: the platform is
unavailable and calls are being retried); `/readyz` reads it (docs/operations.md)."""


async def counted(platform: str, call: Awaitable[T]) -> T:
    """One try of a platform API call, counted in `parley_channel_api_calls` by outcome
    (each adapter's SDK-error mapping goes through here); a failure is tagged with its
    platform, for `call_with_retry` to count its retry."""
    try:
        result = await call
    except ChannelError as exc:
        unavailable = isinstance(exc, ChannelUnavailable)
        if isinstance(exc, ChannelRateLimited):
            outcome = "rate_limited"
        else:
            outcome = "unavailable" if unavailable else "refused"
        metrics.channel_call(platform, outcome)
        HEALTH[platform] = not unavailable  # a 429 or a refusal is an answer
        exc.platform = platform  # type: ignore[attr-defined]
        raise
    metrics.channel_call(platform, "ok")
    HEALTH[platform] = True
    return result


def counting(
    platform: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Decorates an adapter's SDK-error mapping (`telegram_call`, …) with `counted`."""

    def wrap(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await counted(platform, fn(*args, **kwargs))

        return call

    return wrap


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    attempts: int | None = ATTEMPTS,
    backoff: Sequence[float] = BACKOFF,
    rate_limits: int | None = MAX_RATE_LIMITS,
    what: str = "platform call",
) -> T:
    """Await `call()` until it succeeds, waiting on `clock` between tries.

    Args:
        call: makes one attempt (a new awaitable each time).
        clock: where the waits happen (a `FakeClock` in tests).
        attempts: tries in all while `ChannelUnavailable` is raised; None: no limit.
        backoff: the wait after the n-th `ChannelUnavailable` is `backoff[n - 1]`; its
            last value repeats.
        rate_limits: `ChannelRateLimited` answers waited out (each for its `retry_after`)
            before giving up; None: no limit.
        what: names the call in the log.

    Raises:
        ChannelRateLimited | ChannelUnavailable: the last failure, once its limit is reached.
        Exception: anything else `call` raises (e.g. `ChannelRefused`), at once.
    """
    with tracing.span(f"channel {what}", {"parley.channel.call": what}):
        return await _retrying(call, clock, attempts, backoff, rate_limits, what)


async def _retrying(
    call: Callable[[], Awaitable[T]],
    clock: Clock,
    attempts: int | None,
    backoff: Sequence[float],
    rate_limits: int | None,
    what: str,
) -> T:
    unavailable = limited = 0
    while True:
        try:
            return await call()
        except ChannelRateLimited as exc:
            limited += 1
            if rate_limits is not None and limited > rate_limits:
                raise
            log.info("%s rate limited; waiting %.1f s", what, exc.retry_after)
            metrics.channel_retry(getattr(exc, "platform", "other"), "rate_limited")
            await clock.sleep(max(exc.retry_after, 0.0))
        except ChannelUnavailable as exc:
            unavailable += 1
            if attempts is not None and unavailable >= attempts:
                raise
            wait = backoff[min(unavailable, len(backoff)) - 1]
            log.info("%s failed (%s); trying again in %.1f s", what, exc, wait)
            metrics.channel_retry(getattr(exc, "platform", "other"), "unavailable")
            await clock.sleep(wait)
