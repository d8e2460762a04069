"""Discord with leased gateway shards (several workers, docs/scale-out.md): a worker that does not
hold the gateway still posts (replies, cron reports, resume notices go over REST), and the
worker holding `discord:shard:<n>` runs that shard's gateway until the lease is gone.
Real discord.py against the fake Discord, the real agent against the fake LLM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from channels import discord_api
from channels.discord import DiscordChannel
from tests.agentkit import running_agent
from tests.channels.test_discord import discord_config, wait_texts
from tests.fakes.discord import CHANNEL_ID, DM_CHANNEL_ID, TOKEN, FakeDiscord
from tests.fakes.llm import FakeLLM, Reply


@pytest.fixture(autouse=True)
def _restore_discord_endpoints() -> Any:
    with discord_api.library_endpoints_restored():
        yield


async def test_without_the_gateway_replies_still_post_and_the_shard_runs_while_held(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="hello from the shard holder"))
    async with FakeDiscord() as fake, running_agent(fake_llm, tmp_path) as agent:
        channel = DiscordChannel(discord_config(fake), {"DISCORD_BOT_TOKEN": TOKEN})
        (shard,) = channel.singletons()
        assert shard.name == "discord:shard:0"
        await channel.start(agent)
        try:
            assert fake.calls_of("gateway.connect") == []  # not this worker's, yet
            await channel.responder(("discord", CHANNEL_ID, "")).send("a cron report")
            await wait_texts(fake, CHANNEL_ID, ["a cron report"])

            holding = asyncio.create_task(shard.run())  # the lease is ours now
            (identify,) = await fake.wait_for("gateway.identify")
            assert identify.params["shard"] == [0, 1]
            await fake.dm("hi")
            await wait_texts(fake, DM_CHANNEL_ID, ["hello from the shard holder"])

            holding.cancel()  # the lease is lost: the gateway closes at once
            await asyncio.gather(holding, return_exceptions=True)
            await channel.responder(("discord", CHANNEL_ID, "")).send("still posting")
            await wait_texts(fake, CHANNEL_ID, ["a cron report", "still posting"])
            assert len(fake.calls_of("gateway.connect")) == 1
        finally:
            await channel.stop()


async def test_each_shard_is_its_own_lease_and_identifies_as_its_shard(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with FakeDiscord() as fake, running_agent(fake_llm, tmp_path) as agent:
        config = discord_config(fake, shard_count=3)
        channel = DiscordChannel(config, {"DISCORD_BOT_TOKEN": TOKEN})
        shards = channel.singletons()
        assert [s.name for s in shards] == [f"discord:shard:{n}" for n in range(3)]
        await channel.start(agent)
        try:
            holding = asyncio.create_task(shards[2].run())
            (identify,) = await fake.wait_for("gateway.identify")
            assert identify.params["shard"] == [2, 3]
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
        finally:
            await channel.stop()
