"""The operator's HTTP endpoint (`[server] listen`, docs/operations.md#operating-parley):
`/healthz`, `/readyz`, `/metrics`, with `[server] admin_token_env` the operator's page, and
with `[triggers.NAME]` tables the triggers' `POST /hooks/NAME` (`bot.hooks`).

Its own aiohttp listener (aiohttp is already Parley's: Slack's HTTP mode and the Telegram
webhook serve with it), on its own port: the probes must answer whichever channels run,
and an operator's port is not one a platform should reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from bot import admin_page
from bot.admin_html import CSP
from channels import retry
from core import metrics
from core.errors import StoreError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from bot.hooks import Hooks
    from bot.ops_config import ServerConfig
    from bot.singletons import Singletons
    from channels.base import Channel
    from core.agent import Agent

log = logging.getLogger(__name__)

STORE_TIMEOUT = 1.0  # seconds the store has to answer a readiness read
COOKIE = "parley_admin"
QUEUE_DEPTH_CAP = 100_000  # queued runs counted per scrape, at most


class OpsServer:
    """Serves the probes, the metrics and the page for one `parley run` process."""

    def __init__(
        self,
        settings: ServerConfig,
        agent: Agent,
        channels: Mapping[str, Channel],
        *,
        registry: CollectorRegistry,
        token: str | None,
        leased: Singletons | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.settings, self.agent, self.channels = settings, agent, channels
        self.hooks = hooks  # the triggers' route (`bot.hooks`), when any is configured
        self.registry, self.leased = registry, leased
        self._queued = 0  # queued runs at the last scrape
        self._token = token or ""  # "": no page (its routes are not even added)
        # the page's session cookie: a MAC of the token, never the token itself
        self._session = hmac.new(
            self._token.encode(), b"parley operator page", hashlib.sha256
        ).hexdigest()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.serving = False  # channels started and no shutdown begun (`parley run` sets it)
        metrics.gauges(self._gauges)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        if self.hooks is not None:
            self.hooks.add_routes(app)
        if self._token:
            app.router.add_get("/", self.index)
            app.router.add_get("/runs/{run_id}", self.run_page)
            app.router.add_post("/login", self.login)
        return app

    async def start(self) -> None:
        host, port = self.settings.address()
        # lingering_time=0: a body refused mid-read (a trigger's 413) is not read on after
        # the answer to drain the connection; the connection is closed instead
        self._runner = web.AppRunner(
            self.app(), handle_signals=False, access_log=None, lingering_time=0
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{bound_host}:{bound_port}"
        if self.hooks is not None:
            await self.hooks.start()

    async def stop(self) -> None:
        if self.hooks is not None:
            await self.hooks.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- probes and metrics ----------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        problems = await self.not_ready()
        body = {"ready": not problems, "not_ready": problems}
        return web.json_response(body, status=503 if problems else 200)

    async def not_ready(self) -> dict[str, str]:
        """What is not ready, by part: `process`, `store`, `channel:<name>`, `heartbeat`."""
        problems: dict[str, str] = {}
        if not self.serving:
            problems["process"] = "starting or stopping"
        try:
            async with asyncio.timeout(STORE_TIMEOUT):
                await self.agent.store.run("readiness-probe")  # one real read
        except TimeoutError:
            problems["store"] = f"no answer within {STORE_TIMEOUT:g} s"
        except Exception as exc:
            problems["store"] = f"{type(exc).__name__}: {exc}"
        for name, channel in self.channels.items():
            if name == "console":
                continue
            connected = getattr(channel, "connected", None)
            if retry.HEALTH.get(name, True) is False:
                problems[f"channel:{name}"] = "its API is not answering (calls are retried)"
            elif callable(connected) and not connected():
                problems[f"channel:{name}"] = "not connected"
        workers = self.agent.workers
        if workers is not None and not workers.liveness.fresh():
            problems["heartbeat"] = "this worker's heartbeat is not current"
        return problems

    async def metrics(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        with contextlib.suppress(StoreError):  # the last count stands while the store is away
            rows = await self.agent.store.runs(states=["queued"], limit=QUEUE_DEPTH_CAP)
            self._queued = len(rows)
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _gauges(self) -> Iterator[tuple[str, str, Mapping[str, str], float]]:
        lanes = list(self.agent.lanes.values())
        running = sum(1 for lane in lanes if lane.run_id is not None)
        # the store's queue (docs/durability.md#the-queue): every worker reads the same rows
        yield (
            "parley_queue_depth",
            "Queued runs in the store (counted at each scrape).",
            {},
            self._queued,
        )
        yield "parley_lanes_running", "Lanes running a run now.", {}, running
        if self.leased is not None:
            for holder in self.leased.holders:
                held = 1.0 if holder.held.is_set() else 0.0
                yield (
                    "parley_leases_held",
                    "Leases this worker holds.",
                    {"lease": holder.name},
                    held,
                )
        if self.agent.workers is not None:
            fresh = 1.0 if self.agent.workers.liveness.fresh() else 0.0
            yield "parley_worker_heartbeat_fresh", "1 while the heartbeat is current.", {}, fresh

    # ---- the operator's page ---------------------------------------------------------------

    def _allowed(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(
            header.removeprefix("Bearer ").encode(), self._token.encode()
        ):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self._session.encode())

    def _denied(self) -> web.Response:
        return _html(admin_page.login_form(), status=401)

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        given = str(form.get("token", ""))
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            return _html(admin_page.login_form("That is not the token."), status=401)
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(COOKIE, self._session, httponly=True, samesite="Strict", path="/")
        return response

    async def index(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return self._denied()
        overview = await admin_page.overview(self.agent, self.leased)
        return _html(overview)

    async def run_page(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return self._denied()
        page = await admin_page.run_detail(self.agent.store, request.match_info["run_id"])
        if page is None:
            return _html(admin_page.not_found(), status=404)
        return _html(page)


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
        },
    )
