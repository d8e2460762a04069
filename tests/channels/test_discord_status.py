"""Discord's streamed previews (docs/channels.md#answering): a tool step or a compaction
shows as one status line under the preview and is gone from the answer; a run that starts
with a tool step shows the step at once as a message of its own, which becomes the answer;
headings below ###
are bold while streaming too; a long final answer is posted as a new message. Real
discord.py against the fake Discord, the real agent against the fake LLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from channels import discord_api
from core.chat import Inbound, Responder
from core.events import CompactionProgress, Notice, TextDelta
from tests.agentkit import running_agent
from tests.channels.test_discord import StandInAgent, discord_channel, wait_texts
from tests.fakes.discord import DM_CHANNEL_ID, FakeDiscord
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

RUNNING = "⚙️ running `bash`…"


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        yield server


@pytest.fixture(autouse=True)
def _restore_discord_endpoints() -> Any:
    """The adapter points discord.py's class attributes at the fake; put them back."""
    with discord_api.library_endpoints_restored():
        yield


def contents(fake: FakeDiscord) -> list[str]:
    """Every text the bot posted or edited in, in order."""
    return [
        str(c.params.get("content", ""))
        for c in fake.calls
        if c.method in ("create_message", "edit_message")
    ]


async def test_tool_steps_show_as_one_status_line_under_the_preview(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = "Both steps ran."
    fake_llm.script(
        Reply(
            text="Looking. ",
            tool_calls=[ToolCallSpec("bash", {"command": "sleep 0.6; echo one"})],
        ),
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 0.6; echo two"})]),
        Reply(text=answer),
    )
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("run both")
        await wait_texts(fake, DM_CHANNEL_ID, [answer])
        await agent.wait_idle()
    shown = contents(fake)
    with_status = [c for c in shown if c.endswith(RUNNING)]
    assert with_status  # the step was on show while it ran…
    assert all(c.count("⚙️") == 1 for c in with_status)  # …as one line
    assert shown[-1] == answer  # and is not part of the answer


async def test_a_run_that_starts_with_tool_steps_shows_them_at_once_then_answers_there(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """No text before the first tool: its status is posted while it runs (the tool waits
    until the test has seen it), and after the next step the same message turns into the
    answer — one message, never deleted."""
    answer = "Both steps ran."
    wait_for_go = "for i in $(seq 400); do [ -e go ] && break; sleep 0.05; done; echo one"
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": wait_for_go})]),
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})]),
        Reply(text=answer),
    )
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("run both")
        await fake.wait_for("create_message")
        first = fake.calls_of("create_message")[0]
        assert first.params["content"] == RUNNING  # shown while the first step still runs
        assert len(fake_llm.requests) == 1
        (tmp_path / "workspace" / "go").touch()
        await wait_texts(fake, DM_CHANNEL_ID, [answer])
        await agent.wait_idle()
    assert len(fake.calls_of("create_message")) == 1  # the status message became the answer
    assert not fake.calls_of("delete_message")
    edits = fake.calls_of("edit_message")
    assert len({c.params["message_id"] for c in edits}) == 1  # all in that one message
    assert edits[-1].params["content"] == answer


async def test_deep_headings_are_bold_while_streaming(fake: FakeDiscord) -> None:
    async def pause(_: int) -> None:
        await asyncio.sleep(0.4)

    agent = StandInAgent(pieces=["#### Plan\n", "step one, ", "step two."], between=pause)
    async with discord_channel(fake, agent):
        await fake.dm("plan")
        await agent.wait_inbounds(1, finished=True)
    shown = contents(fake)
    assert any(c.startswith("**Plan**") for c in shown[:-1])  # a preview
    assert not any("####" in c for c in shown)


async def test_a_long_final_answer_is_posted_as_a_new_message(fake: FakeDiscord) -> None:
    async def pause(_: int) -> None:
        await asyncio.sleep(0.4)

    pieces = ["Start. ", "x " * 600, "end."]
    agent = StandInAgent(pieces=pieces, between=pause)
    async with discord_channel(fake, agent, repost_final_over=1000):
        await fake.dm("long")
        await agent.wait_inbounds(1, finished=True)
    answer = "".join(pieces)
    await wait_texts(fake, DM_CHANNEL_ID, [answer.strip()])
    creates = fake.calls_of("create_message")
    assert len(creates) == 2  # the preview, then the answer anew
    assert fake.calls_of("delete_message")  # the preview went
    assert creates[-1].params["content"] == answer.strip()


class Compacting:
    """A stand-in agent whose run compacts while it answers."""

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        stream = responder.stream()
        stream(TextDelta("Working on it."))
        stream(CompactionProgress("R2", 120_000))
        stream(CompactionProgress("R2", 120_000, 40_000))
        await asyncio.sleep(0.6)  # longer than the edit interval: the status shows
        await stream.finish("Done.")
        return True


async def test_compaction_status_shows_in_the_preview_and_is_removed(fake: FakeDiscord) -> None:
    async with discord_channel(fake, Compacting()):
        await fake.dm("go")
        await wait_texts(fake, DM_CHANNEL_ID, ["Done."])
    assert "Working on it.\n\n🗜 Compacting: 120k → 40k tokens" in contents(fake)


class NoProviders(StandInAgent):
    """A stand-in agent whose run finds every provider down after a first step
    (docs/providers.md#failover): the failover's warning while it waits, then the message
    that names them."""

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        stream = responder.stream()
        stream(TextDelta("Checking the logs."))
        stream(
            Notice("No LLM provider is available (tried claude, openai); waiting 2s.", "warning")
        )
        await asyncio.sleep(0.6)  # longer than the edit interval: the status shows
        await stream.finish("Sorry: no LLM provider is available right now (tried claude, openai).")
        return True


async def test_the_wait_for_a_provider_shows_as_the_status_line(fake: FakeDiscord) -> None:
    async with discord_channel(fake, NoProviders()):
        await fake.dm("go")
        await wait_texts(
            fake,
            DM_CHANNEL_ID,
            ["Sorry: no LLM provider is available right now (tried claude, openai)."],
        )
    shown = contents(fake)
    waiting = "⏳ No LLM provider is available (tried claude, openai); waiting 2s."
    assert f"Checking the logs.\n\n{waiting}" in shown
    assert not shown[-1].count("⏳")  # never part of the answer
