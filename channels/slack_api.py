"""Calls to Slack's Web API: the one mapping of Slack's failures onto the channel error
tree (`slack_call`), and the sizes and escaping of text as Slack counts and reads it."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from channels.retry import counting
from channels.text import to_slack_mrkdwn, utf8_len
from core.errors import ChannelError, ChannelRateLimited, ChannelRefused, ChannelUnavailable
from core.fence import admit

T = TypeVar("T")

LIMIT_BYTES = 3900  # chat.update refuses text over about 4,000 UTF-8 bytes (msg_too_long)


def escape(text: str) -> str:
    """Slack reads `&`, `<`, `>` as markup in any text: send them escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_size(text: str) -> int:
    """UTF-8 bytes of `text` as sent: the larger of its mrkdwn (final) and escaped plain
    (streaming) forms, so a piece that fits never grows past the limit when formatted."""
    return max(utf8_len(to_slack_mrkdwn(text)), utf8_len(escape(text)))


def _retry_after(response: AsyncSlackResponse) -> float:
    try:
        return max(float(response.headers.get("Retry-After", "1")), 0.0)
    except ValueError:
        return 1.0


def _error_code(exc: SlackApiError) -> str:
    data = exc.response.data
    return str(data.get("error", "")) if isinstance(data, dict) else ""


@counting("slack")
async def slack_call(call: Awaitable[T]) -> T:
    """Run one Web API call; Slack's failures become channel errors (`core.errors`): 429
    (or `ratelimited`) → `ChannelRateLimited`, 5xx and network trouble →
    `ChannelUnavailable`, any other error answer → `ChannelRefused` with Slack's code."""
    await admit(call)  # a run this worker lost is not spoken for (core.fence)
    try:
        return await call
    except SlackApiError as exc:
        status, code = exc.response.status_code, _error_code(exc)
        if status == 429 or code == "ratelimited":
            raise ChannelRateLimited(_retry_after(exc.response)) from exc
        if status >= 500:
            raise ChannelUnavailable(f"slack answered {status}") from exc
        refusal = f"slack refused the call: {code or f'HTTP {status}'}"
        raise ChannelRefused(refusal, status=status, code=code or None) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ChannelUnavailable(f"slack unreachable: {type(exc).__name__}") from exc


def failure_detail(exc: ChannelError) -> str:
    """Slack's error code for a refusal (`invalid_auth`), else what went wrong."""
    return exc.code if isinstance(exc, ChannelRefused) and exc.code else str(exc)
