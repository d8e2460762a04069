"""`POST /hooks/<name>` on `[server] listen` (docs/triggers.md): the team's systems start
runs. The route reads the body within its trigger's limit and hands it to
`core.triggers.receive`; what that answers is counted (`parley_trigger_deliveries_total`),
logged, recorded in the events log and in the audit log (acceptances; refusals at most
once per trigger every 10 s, with the count left out since); an accepted delivery's runs,
committed before the sender hears 202, are announced to the dispatcher, which any worker
claims them through. Once an hour the deliveries older than the dedupe window are purged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from bot.schedules import check_target
from core import metrics
from core.errors import ConfigError, StoreError
from core.triggers.body import length_verdict, read_capped
from core.triggers.config import check_trigger_secrets
from core.triggers.receive import Answer, receive

if TYPE_CHECKING:
    from bot.app import App
    from channels.base import Channel
    from core.agent import Agent

log = logging.getLogger(__name__)

CHUNK = 65_536  # bytes read at a time (the read stops once a body passes its limit)
PURGE_EVERY = 3600.0  # seconds between purges of the dedupe window
AUDIT_REFUSALS_EVERY = 10.0  # seconds between audit entries of one trigger's refusals


class Hooks:
    """The trigger route of one `parley run` process. `now` is the clock (tests inject one)."""

    def __init__(self, app: App, agent: Agent, *, now: Callable[[], float] = time.time) -> None:
        self.app, self.agent, self.now = app, agent, now
        self._purging: asyncio.Task[None] | None = None
        self._refused: dict[str, tuple[float, int]] = {}  # trigger → last audited, left out

    def add_routes(self, web_app: web.Application) -> None:
        web_app.router.add_post("/hooks/{name}", self.handle)

    async def start(self) -> None:
        """Purge the deliveries past their window now (a delivery sent before the route
        serves is judged against the store as it should be), then once an hour."""
        with contextlib.suppress(StoreError):
            await self.purge()
        self._purging = asyncio.create_task(self._purge_loop(), name="trigger purge")

    async def stop(self) -> None:
        if self._purging is not None:
            self._purging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._purging
            self._purging = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        trigger = self.app.config.triggers.get(name)
        if trigger is None:
            return web.Response(status=404, text="no such trigger")
        limit = trigger.max_body_bytes
        verdict = length_verdict(request.headers.get("Content-Length"), limit)
        if verdict == "invalid":
            return self._answered(name, Answer(400, "invalid", "bad Content-Length"))
        body = None if verdict == "too_large" else await read_capped(self._chunks(request), limit)
        if body is None:  # never read to its end: the connection is closed after the answer
            answer = Answer(413, "too_large", f"the body is over {limit} bytes")
            response = self._answered(name, answer)
            response.force_close()
            return response
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            answer = await receive(
                name,
                trigger,
                trigger.secrets(self.app.environ),
                headers,
                body,
                self.now(),
                self.agent.store,
            )
        except StoreError as exc:  # not stored: the sender must try again
            log.warning("trigger %s: the delivery could not be stored: %s", name, exc)
            return web.Response(status=503, text="unavailable", headers={"Retry-After": "30"})
        if answer.conv is not None:
            self.agent.dispatcher.announce(answer.conv)
        return self._answered(name, answer)

    @staticmethod
    async def _chunks(request: web.Request) -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk

    def _refusal_audited(self, name: str) -> int | None:
        """Whether this refusal of `name` gets an audit entry: the first, then at most one
        every `AUDIT_REFUSALS_EVERY` seconds (a flood of forged deliveries must not become
        a flood of hash-chained writes; the metric counts each). The refusals left out
        since the last entry, or None for no entry now."""
        now = time.monotonic()
        last, skipped = self._refused.get(name, (-math.inf, 0))
        if now - last < AUDIT_REFUSALS_EVERY:
            self._refused[name] = (last, skipped + 1)
            return None
        self._refused[name] = (now, 0)
        return skipped

    def _answered(self, name: str, answer: Answer) -> web.Response:
        """Count, log and record `answer`, and make it the response."""
        metrics.trigger_delivery(name, answer.outcome)
        detail = {
            "trigger": name,
            "outcome": answer.outcome,
            "delivery": answer.delivery_id,
            "event_type": answer.event_type,
        }
        if answer.why:
            detail["why"] = answer.why
        if answer.outcome == "unauthorized":
            if (skipped := self._refusal_audited(name)) is not None:
                log.warning("trigger %s: a delivery was refused: %s", name, answer.why)
                refused = {**detail, "refused_since_last_entry": skipped}
                self.agent.audit.record("trigger.unauthorized", f"trigger:{name}", refused)
        elif answer.outcome == "accepted":
            conv = answer.conv or ""
            accepted = {**detail, "runs": list(answer.run_ids)}
            self.agent.audit.record("trigger.accepted", f"trigger:{name}", accepted, conv=conv)
            data = {**accepted, "warnings": list(answer.warnings)}
            run_id = answer.run_ids[0] if answer.run_ids else None
            self.agent.events.emit("trigger.delivery", data, run_id=run_id, conv=conv)
        else:
            self.agent.events.emit("trigger.delivery", detail)
        headers = {}
        if answer.retry_after is not None:
            headers["Retry-After"] = str(answer.retry_after)
        # a refusal says no more than its status: the reason is for the log and the audit
        text = "unauthorized" if answer.outcome == "unauthorized" else answer.text
        return web.json_response(
            {"outcome": answer.outcome, "detail": text}, status=answer.status, headers=headers
        )

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(PURGE_EVERY)
            with contextlib.suppress(StoreError):
                await self.purge()

    async def purge(self) -> int:
        """Forget the deliveries older than the longest dedupe window of any trigger."""
        triggers = self.app.config.triggers.values()
        hours = max((t.dedupe_hours for t in triggers), default=0.0)
        if not hours:
            return 0
        return await self.agent.store.purge_deliveries(self.now() - hours * 3600)


def check_triggers(app: App, channels: Mapping[str, Channel]) -> None:
    """What `parley run` refuses to start with (docs/triggers.md#configuration): triggers
    without `[server] listen` to serve them on, a secret variable unset or unusable, or a
    `channel` it cannot post to.

    Raises:
        ConfigError: naming the key and the fix.
    """
    config = app.config
    if not config.server.listen:
        name = next(iter(config.triggers))
        raise ConfigError(
            "server.listen",
            f"trigger `{name}` is served at POST /hooks/{name} on `[server] listen`, "
            "which is not set",
            'set `listen = "0.0.0.0:9464"` under [server] (the senders must reach it)',
            source=str(config.source) if config.source else None,
        )
    check_trigger_secrets(config.triggers, app.environ)
    for name, trigger in config.triggers.items():
        check_target(
            config, channels, trigger.channel, f"triggers.{name}.channel", f"trigger `{name}`"
        )


__all__ = ["Hooks", "check_triggers"]
