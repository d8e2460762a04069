"""Calls to Discord through discord.py: the one mapping of its failures onto the channel
error tree (`discord_call`), and pointing the library at the configured endpoints
(discord.py has no option for them: two class attributes, process-wide)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Awaitable, Iterator
from typing import TypeVar

import aiohttp
import yarl

from channels.discord_config import DiscordConfig
from channels.retry import counting
from core.errors import ChannelRateLimited, ChannelRefused, ChannelUnavailable
from core.fence import admit

with warnings.catch_warnings():
    # discord.py imports `audioop` (voice support), deprecated since Python 3.11.
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord

T = TypeVar("T")

# Longer 429 waits are raised (as ChannelRateLimited) instead of slept inside discord.py,
# so the reply streamer waits them out on our clock. discord.py's minimum is 30 s.
MAX_RATELIMIT_WAIT = 30.0


def point_library_at(config: DiscordConfig) -> None:
    """Aim discord.py's REST root and gateway at `config` (class attributes; no options)."""
    route, websocket = discord.http.Route, discord.gateway.DiscordWebSocket
    if not hasattr(route, "BASE") or not hasattr(websocket, "DEFAULT_GATEWAY"):
        raise RuntimeError(
            "discord.py no longer has Route.BASE / DiscordWebSocket.DEFAULT_GATEWAY; "
            "the Discord channel cannot be pointed at its endpoints"
        )
    route.BASE = config.api_base_url.rstrip("/")
    if config.gateway_url:
        websocket.DEFAULT_GATEWAY = yarl.URL(config.gateway_url)


@contextlib.contextmanager
def library_endpoints_restored() -> Iterator[None]:
    """Puts back what `point_library_at` changed, on exit (tests and benchmarks that run
    several adapters in one process)."""
    route, websocket = discord.http.Route, discord.gateway.DiscordWebSocket
    base, gateway = route.BASE, websocket.DEFAULT_GATEWAY
    try:
        yield
    finally:
        route.BASE, websocket.DEFAULT_GATEWAY = base, gateway


def _retry_after(exc: discord.HTTPException) -> float:
    header = exc.response.headers.get("Retry-After") if exc.response is not None else None
    try:
        return float(header) if header else 5.0
    except ValueError:
        return 5.0


@counting("discord")
async def discord_call(awaitable: Awaitable[T]) -> T:
    """Await one discord.py call; its failures become channel errors (`core.errors`): 429
    → `ChannelRateLimited`, 5xx and network trouble → `ChannelUnavailable`, any other
    HTTP error → `ChannelRefused` with Discord's JSON error code."""
    await admit(awaitable)  # a run this worker lost is not spoken for (core.fence)
    try:
        return await awaitable
    except discord.RateLimited as exc:  # a wait longer than MAX_RATELIMIT_WAIT
        raise ChannelRateLimited(exc.retry_after) from exc
    except discord.HTTPException as exc:
        if exc.status == 429:  # no `Via` header: discord.py did not retry it
            raise ChannelRateLimited(_retry_after(exc)) from exc
        if exc.status >= 500:
            raise ChannelUnavailable(f"Discord: HTTP {exc.status}") from exc
        refusal = f"Discord refused the call: HTTP {exc.status} (code {exc.code}): {exc.text}"
        code = str(exc.code) if exc.code else None
        raise ChannelRefused(refusal, status=exc.status, code=code) from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ChannelUnavailable(f"Discord unreachable: {exc!r}") from exc
