"""Slack's HTTP Events API endpoint (`mode = "http"`): bolt's aiohttp route, with what bolt
cannot read answered 400 instead of a 500 and a traceback.

Bolt decodes a request's body as UTF-8 and parses it (JSON, or a form whose `payload` is
JSON) before it checks the signature, and raises from there. So the body is read here
first: one that bolt could not read gets 401 if it is not signed with the signing secret
(as bolt answers unsigned requests), else 400 and one warning line. Every other request
goes to bolt as it came (`slack_bolt.adapter.aiohttp`), which checks the signature itself.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Mapping, Sequence

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest

log = logging.getLogger(__name__)

MAX_AGE = 5 * 60  # seconds a signed request stays valid (Slack's documented window)


def events_app(app: AsyncApp, path: str, signing_secret: str) -> web.Application:
    """An aiohttp application that serves `app`'s events, commands and actions at `path`."""

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        bolt_request = _bolt_request(body, request)
        if bolt_request is None:
            if not signed(body, request.headers, signing_secret, now=time.time()):
                return web.json_response({"error": "invalid request"}, status=401)
            log.warning(
                "slack: a signed request whose body is not UTF-8 JSON or form data; "
                "answered 400 (%d bytes, %s)",
                len(body),
                request.content_type,
            )
            return web.Response(status=400, text="the body is not UTF-8 JSON or form data")
        return await to_aiohttp_response(await app.async_dispatch(bolt_request))

    web_app = web.Application()
    web_app.router.add_post(path, handle)
    return web_app


def _bolt_request(body: bytes, request: web.Request) -> AsyncBoltRequest | None:
    """The request as bolt takes it in, or None if bolt cannot read its body."""
    try:
        text = body.decode("utf-8")
        headers: dict[str, str | Sequence[str]] = dict(request.headers)
        bolt_request = AsyncBoltRequest(body=text, query=request.query_string, headers=headers)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
        return None  # not UTF-8, not JSON, or JSON whose shape bolt's reading trips on
    return bolt_request if isinstance(bolt_request.body, dict) else None


def signed(body: bytes, headers: Mapping[str, str], secret: str, *, now: float) -> bool:
    """Whether `body` carries a valid Slack signature made at most `MAX_AGE` ago: HMAC-SHA256
    with the signing secret of `v0:<timestamp>:<the raw body>`, over its bytes as sent.
    (slack_sdk's `SignatureVerifier` decodes the body as UTF-8 first and raises on any
    other, and on a timestamp that is not a number: exactly the requests this is for.)"""
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    if not timestamp.isdigit() or abs(now - int(timestamp)) > MAX_AGE:
        return False
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.encode())
