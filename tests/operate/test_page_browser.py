"""The operator's page in a real headless browser (Debian's chromium and chromedriver,
driven by selenium): log in with the token, open a run, see its tool calls; without the
token it answers 401; a message text holding `<script>` is shown as text; the usage chart
and its table show the session's cost, and a model name holding `<script>` is text.

Where chromium or chromedriver is missing the test skips, saying how to install them —
unless PARLEY_REQUIRE_BROWSER=1 (CI, where `make test` installs them), where it fails.
With PARLEY_SCREENSHOT=<path> it also saves a screenshot of the overview there (workers,
runs, usage and cost per day: docs/operator-page.png is made so), and with
PARLEY_SCREENSHOT_RUN=<path> one of the run's page."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bot.ops_config import ServerConfig
from bot.server import OpsServer
from core import metrics
from core.agent import Agent
from core.store import LlmCall
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

TOKEN = "operator-token-5b1e0c"
HOSTILE = "<script>alert('pwned')</script> & <b>bold?</b>"
PRICED_MODEL = f"priced-{HOSTILE}"
DAY = 86400.0


def priced(run_id: str, at: float, cost: float) -> LlmCall:
    """A priced call of the session, as the cost meter records it (docs/cost.md)."""
    return LlmCall(
        at, run_id, "test:c1:", "u1", "test", "", "fake", PRICED_MODEL, 1200, 300, 0, 80, cost
    )


def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver), or the test skips/fails saying why there are none."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    reason = (
        "no headless browser: apt-get install chromium chromium-driver "
        "(`make test` does so where it runs as root)"
    )
    if os.environ.get("PARLEY_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, and PARLEY_REQUIRE_BROWSER=1")
    pytest.skip(reason)


@pytest.fixture
async def page(fake_llm: FakeLLM, tmp_path: Path) -> AsyncIterator[tuple[OpsServer, Agent, str]]:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "x.txt", "content": HOSTILE})]),
        Reply(text=f"I wrote {HOSTILE}"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        report = await agent.run(inbound(f"please write {HOSTILE}"), RecordingResponder())
        assert report.state == "completed"
        await agent.store.append_audit("command", "slack:U1", "test:c1:", f'"{HOSTILE}"')
        now = time.time()
        agent.store.record_llm_call(priced(report.run_id, now, 0.0125))
        agent.store.record_llm_call(priced(report.run_id, now - 2 * DAY, 0.25))
        await agent.store.flush()
        registry = metrics.enable()
        server = OpsServer(
            ServerConfig(listen="127.0.0.1:0", admin_token_env="X"),
            agent,
            {},
            registry=registry,
            token=TOKEN,
        )
        await server.start()
        server.serving = True
        try:
            yield server, agent, report.run_id
        finally:
            await server.stop()
            metrics.disable()


async def test_the_page_needs_the_token(page: tuple[OpsServer, Agent, str]) -> None:
    server, _, run_id = page
    async with httpx.AsyncClient(base_url=server.url) as http:
        for path in ("/", f"/runs/{run_id}"):
            denied = await http.get(path)
            assert denied.status_code == 401
            assert run_id not in denied.text
            wrong = await http.get(path, headers={"Authorization": "Bearer not-it"})
            assert wrong.status_code == 401
            forged = await http.get(path, headers={"Cookie": f"parley_admin={TOKEN}"})
            assert forged.status_code == 401
        login = await http.post("/login", data={"token": "not-it"})
        assert login.status_code == 401
        allowed = await http.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200
        assert run_id in allowed.text
        assert "Audit log" in allowed.text
        assert "slack:U1" in allowed.text
        assert "<script>" not in allowed.text  # the audit entry's detail, escaped
        assert "&lt;script&gt;" in allowed.text
        assert "One process (SQLite)" in allowed.text  # the workers panel on SQLite
        assert "Usage and cost per day" in allowed.text
        # the probes stay open
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200


async def test_log_in_open_a_run_and_see_its_tool_calls_in_a_browser(
    page: tuple[OpsServer, Agent, str],
) -> None:
    chromium, driver_path = browser_paths()
    server, _, run_id = page
    # selenium is synchronous: it runs in a thread while this loop serves the page
    result = await asyncio.to_thread(_browse, chromium, driver_path, server.url, run_id)
    assert result["login_title"] == "Parley: log in"
    assert run_id in result["overview"]
    assert HOSTILE in result["overview"]  # the audit entry, shown as text
    assert "write_file" in result["tool_calls"]
    assert HOSTILE in result["tool_calls"]  # the arguments, shown as text
    assert HOSTILE in result["transcript"]  # the user's message, shown as text
    assert result["scripts"] == 0  # nothing the texts held became an element
    # the policy refused nothing the page needs, and its style applied
    assert not [m for m in result["console"] if "Content Security Policy" in m], result["console"]
    assert result["header_background"] == "rgba(243, 243, 243, 1)"
    assert result["bold"] == 0
    assert not result["alert"]
    # usage and cost per day: 30 bars, the session's two priced days the only costs
    assert result["overview_scripts"] == 0
    bars = result["bars"]
    assert isinstance(bars, list)
    assert len(bars) == 30
    costly = [(tip, height) for tip, height in bars if height > 0]
    assert len(costly) == 2
    (older, older_h), (today, today_h) = costly
    assert "$0.2500, 1 calls" in older
    assert "$0.0125" in today
    assert older_h > today_h
    assert "$0.2500" in result["days"]
    assert "$0.0125" in result["days"]
    assert "total" in result["days"]
    assert f"fake/{PRICED_MODEL}" in result["models"]  # the model name, shown as text


def _browse(chromium: str, driver_path: str, url: str, run_id: str) -> dict[str, object]:
    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1400")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP reports land there
    browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        browser.set_page_load_timeout(30)
        browser.get(url + "/")
        found: dict[str, object] = {"login_title": browser.title}
        browser.find_element(By.NAME, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        # a click navigates without waiting: the overview is there once its run link is
        WebDriverWait(browser, 30).until(seen.presence_of_element_located((By.LINK_TEXT, run_id)))
        found["overview"] = browser.find_element(By.TAG_NAME, "body").text
        # the page's own style applies under its Content-Security-Policy (docs/operations.md)
        found["header_background"] = browser.find_element(By.TAG_NAME, "th").value_of_css_property(
            "background-color"
        )
        found["overview_scripts"] = len(browser.find_elements(By.TAG_NAME, "script"))
        found["bars"] = [
            (
                rect.find_element(By.TAG_NAME, "title").get_attribute("textContent"),
                float(rect.get_attribute("height") or 0),
            )
            for rect in browser.find_elements(By.CSS_SELECTOR, ".usage svg rect")
        ]
        found["days"] = browser.find_element(By.CSS_SELECTOR, ".usage table").text
        headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h3")]
        models = browser.find_elements(
            By.XPATH, "//h3[starts-with(., 'By model')]/following-sibling::table[1]"
        )
        found["models"] = models[0].text if models else ""
        if shot := os.environ.get("PARLEY_SCREENSHOT"):
            browser.save_screenshot(shot)  # the overview: workers, runs, usage and cost
        browser.find_element(By.LINK_TEXT, run_id).click()
        WebDriverWait(browser, 30).until(
            seen.presence_of_element_located((By.XPATH, "//h2[. = 'Tool calls']"))
        )
        tables = browser.find_elements(By.TAG_NAME, "table")
        headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
        found["tool_calls"] = tables[1 + headings.index("Tool calls")].text
        found["transcript"] = tables[1 + headings.index("Transcript of its conversation")].text
        found["scripts"] = len(browser.find_elements(By.TAG_NAME, "script"))
        found["bold"] = len(browser.find_elements(By.CSS_SELECTOR, "td b:not(.state-failed)"))
        try:
            browser.switch_to.alert  # noqa: B018
            found["alert"] = True
        except NoAlertPresentException:
            found["alert"] = False
        if shot := os.environ.get("PARLEY_SCREENSHOT_RUN"):
            browser.save_screenshot(shot)
        found["console"] = [entry["message"] for entry in browser.get_log("browser")]
        return found
    finally:
        browser.quit()
