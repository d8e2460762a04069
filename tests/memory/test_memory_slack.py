"""Scoped memory through a real platform adapter: slack-bolt against the fake Slack, the
real agent and the fake LLM. What Alice keeps for herself in her DM is neither recalled
nor listed by `!memory` in a channel thread; `/parley memory` in her DM lists it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.agentkit import running_agent
from tests.channels.test_slack import config, final_text, slack_channel
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.slack import FakeSlack


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as slack:
        yield slack


def _remember(text: str, scope: str) -> Reply:
    return Reply(tool_calls=[ToolCallSpec("remember", {"text": text, "scope": scope})])


async def test_a_dm_memory_stays_out_of_a_channel_on_slack(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        _remember("Alice's locker code is 4711", "user"),
        Reply(text="Noted, just for you."),
        _remember("standup is at 9:30", "channel"),
        Reply(text="Noted for the channel."),
        Reply(tool_calls=[ToolCallSpec("recall", {"query": "locker code standup"})]),
        Reply(text="Standup is at 9:30."),
    )
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        await fake.dm("remember my locker code is 4711, just for me")
        await final_text(fake, "D1", None, "Noted, just for you.")
        root = await fake.mention("standup is at 9:30 now, remember it for the channel")
        await final_text(fake, "C1", root.ts, "Noted for the channel.")
        await fake.channel_message(
            "what's my locker code, and when is standup?", user="U1", thread_ts=root.ts
        )
        await final_text(fake, "C1", root.ts, "Standup is at 9:30.")
        recalled = [m for m in fake_llm.requests[-1].json["messages"] if m["role"] == "tool"]
        assert "standup is at 9:30" in recalled[-1]["content"]
        assert "4711" not in recalled[-1]["content"]

        await fake.channel_message("!memory", thread_ts=root.ts)
        listed = await fake.until(
            lambda: next(
                (m for m in fake.thread("C1", root.ts) if "standup is at 9:30" in m.text), None
            ),
            what="the /memory listing in the thread",
        )
        assert "4711" not in listed.text
        assert "direct message" in listed.text

        await fake.slash("/parley", "memory")
        in_dm = await fake.until(
            lambda: next((m for m in fake.thread("D1", None) if "4711" in m.text), None),
            what="the /memory listing in the DM",
        )
        assert "standup" not in in_dm.text
