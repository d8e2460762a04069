"""The operator's page's Content-Security-Policy (docs/operations.md#the-operators-page):
what the real server sends on every page is what the docs state, line for line, and it
lets the page work — its one `<style>` element is the one the policy's hash admits, and
no page needs anything the policy refuses (a script, a `style=` attribute)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bot.ops_config import ServerConfig
from bot.server import OpsServer
from core import metrics
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply
from tests.process import REPO

TOKEN = "operator-token-c5p0"
HOSTILE = "<style>tr{display:none}</style><p style=color:red>x</p><script>alert(1)</script>"


def directives(policy: str) -> dict[str, list[str]]:
    """A policy as {directive: its sources}, in any order and spacing."""
    parsed: dict[str, list[str]] = {}
    for part in policy.split(";"):
        if words := part.split():
            assert words[0] not in parsed, f"{words[0]} given twice"
            parsed[words[0].lower()] = words[1:]
    return parsed


def documented_policy() -> str:
    """The policy as docs/operations.md states it: its one `Content-Security-Policy:` line."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    lines = re.findall(r"^\s*Content-Security-Policy: (.+?)\s*$", text, flags=re.MULTILINE)
    assert len(lines) == 1, f"docs/operations.md states the policy {len(lines)} times"
    return str(lines[0])


@pytest.fixture
async def served(fake_llm: FakeLLM, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """(the page's URL, a run's id): a run whose message and answer hold markup."""
    fake_llm.script(Reply(text=f"you said {HOSTILE}"))
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound(HOSTILE), RecordingResponder())
        assert report.state == "completed"
        server = OpsServer(
            ServerConfig(listen="127.0.0.1:0", admin_token_env="X"),
            agent,
            {},
            registry=metrics.enable(),
            token=TOKEN,
        )
        await server.start()
        try:
            yield server.url, report.run_id
        finally:
            await server.stop()
            metrics.disable()


async def test_every_page_sends_the_policy_the_docs_state(served: tuple[str, str]) -> None:
    url, run_id = served
    stated = directives(documented_policy())
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url) as http:
        pages = {
            "the login form": await http.get("/"),
            "a refused login": await http.post("/login", data={"token": "not-it"}),
            "the overview": await http.get("/", headers=bearer),
            "a run's page": await http.get(f"/runs/{run_id}", headers=bearer),
            "no such run": await http.get("/runs/no-such-run", headers=bearer),
        }
    assert [p.status_code for p in pages.values()] == [401, 401, 200, 200, 404]
    for name, page in pages.items():
        assert directives(page.headers["Content-Security-Policy"]) == stated, name
        assert page.headers["X-Content-Type-Options"] == "nosniff", name


async def test_the_policy_admits_the_page_s_own_style_and_nothing_injected(
    served: tuple[str, str],
) -> None:
    """A policy that blocked the page's style would leave it unstyled without an error: the
    hash it admits is checked against the `<style>` each page really serves."""
    url, run_id = served
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url) as http:
        pages = [
            await http.get("/"),
            await http.get("/", headers=bearer),
            await http.get(f"/runs/{run_id}", headers=bearer),
        ]
    assert "&lt;style&gt;" in pages[2].text  # the run's message is on its page, as text
    for page in pages:
        policy = directives(page.headers["Content-Security-Policy"])
        assert policy["default-src"] == ["'none'"]
        assert "'unsafe-inline'" not in policy["style-src"]
        styles = re.findall(r"<style>(.*?)</style>", page.text, flags=re.DOTALL)
        assert len(styles) == 1  # the page's own; the hostile one is escaped
        digest = base64.b64encode(hashlib.sha256(styles[0].encode()).digest()).decode()
        assert policy["style-src"] == [f"'sha256-{digest}'"]
        # what the policy would refuse, the page's markup does not use
        assert not re.search(r"<script|<[a-z][^>]*\sstyle\s*=", page.text, flags=re.IGNORECASE)
