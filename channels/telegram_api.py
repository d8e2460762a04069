"""Calls to Telegram's Bot API through python-telegram-bot: the one mapping of PTB's
errors onto the channel error tree (`telegram_call`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from channels.retry import counting
from core.errors import ChannelRateLimited, ChannelRefused, ChannelUnavailable
from core.fence import admit

# PTB ≥ 22.2 warns on every int-valued time period unless opted in to timedelta values.
os.environ.setdefault("PTB_TIMEDELTA", "1")

_T = TypeVar("_T")


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


# PTB's exceptions carry no HTTP status; each refusal class stands for one (InvalidToken
# also for 404). BadRequest is a NetworkError subclass, so these are checked first.
_REFUSALS: tuple[tuple[type[TelegramError], int], ...] = (
    (BadRequest, 400),
    (ChatMigrated, 400),
    (InvalidToken, 401),
    (Forbidden, 403),
    (Conflict, 409),
)


@counting("telegram")
async def telegram_call(call: Awaitable[_T]) -> _T:
    """Await a Bot API call; PTB's errors become channel errors (`core.errors`): 429 →
    `ChannelRateLimited`, 5xx and network trouble → `ChannelUnavailable`, any other
    error answer → `ChannelRefused`, whose `code` is Telegram's error description
    (Telegram has no error codes)."""
    await admit(call)  # a run this worker lost is not spoken for (core.fence)
    try:
        return await call
    except RetryAfter as exc:
        raise ChannelRateLimited(_seconds(exc.retry_after)) from exc
    except TelegramError as exc:
        status = next((status for kind, status in _REFUSALS if isinstance(exc, kind)), None)
        if status is None and isinstance(exc, NetworkError):  # TimedOut, 5xx, connection
            raise ChannelUnavailable(f"telegram: {exc.message}") from exc
        refusal = f"telegram refused the call: {exc.message}"
        raise ChannelRefused(refusal, status=status, code=exc.message) from exc


def says(exc: ChannelRefused, phrase: str) -> bool:
    """True if Telegram's refusal says `phrase` (its description is all it tells)."""
    return phrase in (exc.code or "").lower()


def bot_id_of(token: str) -> str:
    """The bot's id: the part of its token before ":", never any of the secret part (a
    malformed token is named by a hash of it)."""
    bot_id = token.partition(":")[0]
    return bot_id if bot_id.isdigit() else hashlib.sha256(token.encode()).hexdigest()[:12]
