"""Shared fixtures: no proxies, no network, a fresh fake LLM per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from core.providers import Provider, ProviderSettings, build_provider
from core.sandbox.settings import SandboxSettings
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM

os.environ.setdefault("PTB_TIMEDELTA", "1")


@pytest.fixture(autouse=True)
def _private_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Defaults such as `~/.parley/parley.db` land in a temporary home, never the real one."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(autouse=True)
def _no_failed_store_writes(request: pytest.FixtureRequest) -> Iterator[None]:
    """A store write that fails is a bug unless the test causes it on purpose."""
    from core.store import failed_writes

    before = failed_writes()
    yield
    failed = failed_writes() - before
    if failed and request.node.get_closest_marker("store_failures_expected") is None:
        pytest.fail(f"{failed} store write(s) failed during this test (see the log)")


@pytest.fixture(autouse=True)
def _scrub_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proxies would route 127.0.0.1 traffic away (and some clients ignore NO_PROXY)."""
    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


_OPEN_PROVIDERS: list[Provider] = []


@pytest.fixture(autouse=True)
async def _close_providers() -> AsyncIterator[None]:
    """Providers built with `provider_for` own an HTTP client: close them after each test."""
    yield
    while _OPEN_PROVIDERS:
        await _OPEN_PROVIDERS.pop().aclose()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sandbox(tmp_path: Path) -> SandboxSettings:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return SandboxSettings(
        workspace=workspace,
        denied_paths=[tmp_path / "secret"],
        artifacts_dir=tmp_path / "artifacts",
        default_timeout=10,
    )


def provider_for(
    fake: FakeLLM, kind: str = "openai_chat", clock: FakeClock | None = None, **overrides: object
) -> Provider:
    """A real provider pointed at the fake (Anthropic posts to the root URL)."""
    base = fake.root_url if kind == "anthropic" else fake.base_url
    settings = ProviderSettings(
        name=f"fake-{kind}",
        kind=kind,
        base_url=base,
        model="fake-model",
        api_key="k",
        **overrides,  # type: ignore[arg-type]
    )
    provider = build_provider(settings, clock=clock or FakeClock())
    _OPEN_PROVIDERS.append(provider)
    return provider


@pytest.fixture
def landlock_required() -> None:
    """Skip where the kernel has no Landlock; fail instead under PARLEY_REQUIRE_SANDBOX=1
    (CI), so the wall's tests cannot quietly stop running."""
    from core.sandbox import landlock

    if landlock.abi_version() == 0:
        reason = "this kernel has no Landlock"
        if os.environ.get("PARLEY_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"{reason}, and PARLEY_REQUIRE_SANDBOX=1")
        pytest.skip(reason)
