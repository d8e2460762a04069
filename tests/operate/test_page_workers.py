"""The operator's page's workers on PostgreSQL (docs/operations.md#the-operators-page):
every worker the shared store lists, with its last heartbeat's age and the leases it
holds — here a real agent joined as a worker and a second worker (another store on the
same schema) that beats and holds a lease — this one marked; a lease name holding markup
is shown as text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from bot.app import App, build_registry
from bot.ops_config import ServerConfig
from bot.server import OpsServer
from core import metrics
from core.store import open_store
from tests.agentkit import agent_config
from tests.fakes.llm import FakeLLM
from tests.store.conftest import postgres_schema

TOKEN = "operator-token-77aa01"
OTHER = "other-host:4242:abc123"
LEASE = "telegram:poll:<script>x</script>"
# long enough that the second worker's one heartbeat stays current (and it is not taken
# for dead) however slowly the machine runs the test
SLOW = {"heartbeat_seconds": 0.5, "worker_timeout_seconds": 60.0, "sweep_seconds": 0.5}


def workers_table(page: str) -> list[list[str]]:
    """The rows of the Workers panel's table, each cell's markup."""
    panel = page[page.index("<h2>Workers</h2>") : page.index("<h3>This worker</h3>")]
    rows = re.findall(r"<tr>(.*?)</tr>", panel)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows[1:]]


async def test_the_page_lists_every_worker_with_its_heartbeat_and_leases(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with postgres_schema() as url:
        store: dict[str, Any] = {"path": None, "url": url, **SLOW}
        cfg = agent_config(fake_llm, tmp_path, store=store)
        app = App(cfg, {}, build_registry(cfg, {}))
        agent = await app.open_agent(shared_channels=["slack"])
        other = await open_store(url)
        server: OpsServer | None = None
        try:
            await agent.reconcile()  # joins: beats
            assert agent.workers is not None
            assert await other.worker_heartbeat(OTHER) is False  # a new worker
            assert await other.take_lease(LEASE, OTHER, 60)
            server = OpsServer(
                ServerConfig(listen="127.0.0.1:0", admin_token_env="X"),
                agent,
                {},
                registry=metrics.enable(),
                token=TOKEN,
            )
            await server.start()
            async with httpx.AsyncClient(base_url=server.url) as http:
                page = await http.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
            assert page.status_code == 200
            rows = workers_table(page.text)
            by_id = {re.sub(r" <b>.*", "", row[0]): row for row in rows}
            assert set(by_id) == {agent.workers.id, OTHER}
            this, second = by_id[agent.workers.id], by_id[OTHER]
            assert "(this one)" in this[0]
            assert "(this one)" not in second[0]
            for row in (this, second):
                assert re.fullmatch(r"\d+(\.\d)? s ago", row[1]), row  # current, not silent
            assert this[3] == "none"
            assert re.fullmatch(
                r"telegram:poll:&lt;script&gt;x&lt;/script&gt; \(\d+ s\)", second[3]
            ), second[3]
            assert "<script>" not in page.text
            assert "One process" not in page.text
        finally:
            if server is not None:
                await server.stop()
            metrics.disable()
            await other.aclose()
            await app.close_agent(agent, grace=1.0)
            await app.aclose()
