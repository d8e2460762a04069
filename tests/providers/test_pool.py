"""The connection pool is sized from configuration: no silent queue behind a fixed 100,
every connection kept alive, and a configured cap that is kept and named when it bites."""

from __future__ import annotations

import asyncio

import httpx2
import pytest

from core.config import ProviderConfig
from core.errors import ProviderUnavailable
from core.messages import Message
from core.providers.errors import map_transport_errors
from core.providers.transport import pool_limits
from tests.conftest import provider_for
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply

BEYOND_THE_OLD_POOL = 120  # the old fixed pool held 100 connections


def gated(fake: FakeLLM) -> asyncio.Event:
    """Every request waits for the returned event before it is answered."""
    gate = asyncio.Event()

    async def answer(_request: RecordedRequest) -> Reply:
        await gate.wait()
        return Reply(text="ok")

    fake.responder = answer
    return gate


async def burst(provider: object, n: int) -> list[asyncio.Task[object]]:
    complete = provider.complete  # type: ignore[attr-defined]
    return [asyncio.create_task(complete([Message.user("hi")])) for _ in range(n)]


async def test_concurrent_turns_beyond_100_all_reach_the_server(fake_llm: FakeLLM) -> None:
    gate = gated(fake_llm)
    provider = provider_for(fake_llm, max_retries=0)
    tasks = await burst(provider, BEYOND_THE_OLD_POOL)
    # Every request is at the server while none is answered: nobody queued for a connection.
    await fake_llm.wait_for_requests(BEYOND_THE_OLD_POOL, timeout=30)
    gate.set()
    done = await asyncio.gather(*tasks)
    assert {d.message.content for d in done} == {"ok"}  # type: ignore[attr-defined]
    assert fake_llm.connections == BEYOND_THE_OLD_POOL


async def test_many_streams_spread_over_pools_whose_connections_stay_alive(
    fake_llm: FakeLLM,
) -> None:
    """Beyond `POOL_STREAMS` open streams another pool is opened beside the first (one
    pool's bookkeeping grows with its connections squared); every connection of every
    pool is used again by the next burst, and one caller's calls keep to one."""
    from core.providers.transport import POOL_STREAMS

    gate = gated(fake_llm)
    provider = provider_for(fake_llm, max_retries=0)
    n = POOL_STREAMS * 2 + 1
    tasks = await burst(provider, n)
    await fake_llm.wait_for_requests(n, timeout=30)
    pools = [provider.client, *provider.endpoint._more]  # type: ignore[attr-defined]
    assert len(pools) == 3
    gate.set()
    await asyncio.gather(*tasks)
    assert fake_llm.connections == n
    await asyncio.gather(*await burst(provider, n))  # the next burst opens nothing new
    for _ in range(3):
        await provider.complete([Message.user("hi")])
    assert fake_llm.connections == n
    await provider.aclose()
    assert all(pool.is_closed for pool in pools)


@pytest.mark.parametrize("cap", [None, 1, 8, 500])
def test_every_pooled_connection_is_kept_alive(cap: int | None) -> None:
    limits = pool_limits(cap)
    assert (limits.max_connections, limits.max_keepalive_connections) == (cap, cap)


async def test_a_configured_cap_is_kept(fake_llm: FakeLLM) -> None:
    gate = gated(fake_llm)
    provider = provider_for(fake_llm, max_retries=0, max_connections=2)
    tasks = await burst(provider, 3)
    await fake_llm.wait_for_requests(2)
    await asyncio.sleep(0.05)  # time for a third request, were it allowed through
    assert len(fake_llm.requests) == 2
    gate.set()
    await asyncio.gather(*tasks)
    assert (len(fake_llm.requests), fake_llm.connections) == (3, 2)


def test_a_pool_timeout_names_the_setting_to_raise() -> None:
    with (
        pytest.raises(ProviderUnavailable, match=r"all 2 connections to openai .*max_connections"),
        map_transport_errors("openai", 2),
    ):
        raise httpx2.PoolTimeout("no connection free")


def test_the_cap_is_read_from_the_provider_config() -> None:
    base = {"kind": "openai_chat", "model": "m", "base_url": "http://x"}
    assert ProviderConfig.model_validate(base).settings("p", {}).max_connections is None
    capped = ProviderConfig.model_validate({**base, "max_connections": 8})
    assert capped.settings("p", {}).max_connections == 8
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ProviderConfig.model_validate({**base, "max_connections": 0})


async def test_https_endpoints_share_one_verifying_tls_context_and_plain_http_loads_none() -> None:
    from core.providers.base import ProviderSettings
    from core.providers.transport import Endpoint, tls_context

    def context(url: str) -> object:
        settings = ProviderSettings("p", "openai_chat", url, "m")
        pool = Endpoint(settings, {}).client._transport._pool  # type: ignore[attr-defined]
        return pool._ssl_context

    one, two = context("https://a.example/v1"), context("https://b.example/v1")
    assert one is two is tls_context()
    assert tls_context().verify_mode.name == "CERT_REQUIRED"
    assert context("http://127.0.0.1:8080/v1") is not one
