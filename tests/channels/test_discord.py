"""The Discord channel end to end: real discord.py against the fake Discord (REST +
gateway), the real agent against the fake LLM. A stand-in agent is used only where a
test is about the adapter alone (what it hands over, its clock-driven retries)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from channels import discord_api
from channels.discord import DiscordChannel
from channels.discord_config import DiscordConfig
from channels.text import split_message, to_discord
from core.chat import Inbound, Responder
from core.clock import Clock
from core.command_table import COMMANDS
from core.errors import ChannelError, ConfigError
from core.events import TextDelta
from tests.agentkit import running_agent
from tests.fakes.clock import FakeClock
from tests.fakes.discord import (
    BOT_THREAD_ID,
    CHANNEL_ID,
    DM_CHANNEL_ID,
    INTENTS_NEEDED,
    OTHER_BOT,
    OTHER_THREAD_ID,
    STRANGER,
    TOKEN,
    USER,
    FakeDiscord,
)
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

POSTS = ("create_message", "edit_message")


@pytest.fixture(autouse=True)
def _restore_discord_endpoints() -> Any:
    """The adapter points discord.py's class attributes at the fake; put them back."""
    with discord_api.library_endpoints_restored():
        yield


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        yield server


def discord_config(fake: FakeDiscord, **overrides: Any) -> DiscordConfig:
    settings: dict[str, Any] = {
        "enabled": True,
        "allow_users": [USER.id, OTHER_BOT.id],  # the other bot is refused as a bot
        "approvers": [USER.id],
        "api_base_url": fake.url,
        "gateway_url": fake.gateway_url,
        "edit_interval_seconds": 0.2,
        **overrides,
    }
    return DiscordConfig(**settings)


@asynccontextmanager
async def discord_channel(
    fake: FakeDiscord, agent: Any, *, clock: Clock | None = None, **overrides: Any
) -> AsyncIterator[DiscordChannel]:
    channel = DiscordChannel(
        discord_config(fake, **overrides), {"DISCORD_BOT_TOKEN": TOKEN}, clock=clock
    )
    await channel.start(agent)
    try:
        yield channel
    finally:
        await channel.stop()


@dataclass
class StandInAgent:
    """An AgentPort for adapter-only tests: records inbounds; for each, streams `pieces`
    (awaiting `between(i)` after piece i) and finishes with their concatenation."""

    pieces: list[str] = field(default_factory=list)
    between: Callable[[int], Awaitable[None]] | None = None
    inbounds: list[Inbound] = field(default_factory=list)
    finished: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.inbounds.append(inbound)
        self.changed.set()
        if self.pieces:
            stream = responder.stream()
            for i, piece in enumerate(self.pieces):
                stream(TextDelta(piece))
                if self.between is not None:
                    await self.between(i)
            await stream.finish("".join(self.pieces))
        self.finished += 1
        self.changed.set()
        return True

    async def wait_inbounds(self, count: int, *, finished: bool = False) -> list[Inbound]:
        """Wait for `count` inbounds (with `finished`, until their replies are done)."""
        async with asyncio.timeout(10):
            while len(self.inbounds) < count or (finished and self.finished < count):
                self.changed.clear()
                await self.changed.wait()
        return self.inbounds


async def wait_texts(fake: FakeDiscord, channel_id: str, expected: list[str]) -> None:
    """Wait until the bot's messages in a channel read exactly `expected`."""
    try:
        await fake.wait_until(lambda: fake.bot_texts(channel_id) == expected)
    except TimeoutError:
        shown = fake.bot_texts(channel_id)
        raise AssertionError(f"bot messages: {shown!r}; expected {expected!r}") from None


def posts_in(fake: FakeDiscord, channel_id: str) -> list[str]:
    return [c.method for c in fake.calls if c.params.get("channel_id") == channel_id]


# --------------------------------------------------------------------------- streaming


async def test_dm_gets_one_streamed_message_edited_to_the_full_answer(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = ("Here is a streamed answer, sent a few characters at a time. " * 4).strip()
    fake_llm.script(Reply(text=answer, chunk_size=12, chunk_delay=0.03))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("tell me something")
        await wait_texts(fake, DM_CHANNEL_ID, [answer])
        await agent.wait_idle()
    calls = posts_in(fake, DM_CHANNEL_ID)
    assert calls.count("create_message") == 1
    edits = fake.calls_of("edit_message")
    assert edits
    assert edits[-1].params["content"] == answer
    assert fake.calls_of("trigger_typing")


async def test_lone_surrogate_in_a_message_is_replaced_not_fatal(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="got it"))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("caf\u00e9 \ud800 ok")  # JSON "\ud800": valid JSON, invalid Unicode
        await wait_texts(fake, DM_CHANNEL_ID, ["got it"])
        await agent.wait_idle()
    [user] = [m["content"] for m in fake_llm.requests[0].json["messages"] if m["role"] == "user"]
    assert user == "caf\u00e9 \ufffd ok"  # and no store write failed


async def test_long_answer_with_code_block_is_split_at_2000_chars(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    code = "\n".join(f"print('line {i:03d} of a long listing')" for i in range(110))
    prose = "A paragraph of explanation that goes on for a while. " * 14
    answer = f"{prose}\n\n```python\n{code}\n```\n\n{prose}\n\n{prose}"
    assert len(answer) > 6000
    fake_llm.script(Reply(text=answer, chunk_size=400))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.mention("show me the code")
        expected = [to_discord(piece) for piece in split_message(answer, 2000)]
        await wait_texts(fake, CHANNEL_ID, expected)
        await agent.wait_idle()
    texts = fake.bot_texts(CHANNEL_ID)
    assert len(texts) == 4
    assert all(len(text) <= 2000 for text in texts)
    assert all(text.count("```") % 2 == 0 for text in texts)  # no fence left open
    assert any(text.startswith("```python") for text in texts[1:])  # reopened


async def test_rate_limited_edit_is_retried_and_the_final_text_arrives(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = ("An answer that needs several edits while it streams in. " * 3).strip()
    fake_llm.script(Reply(text=answer, chunk_size=10, chunk_delay=0.03))
    fake.fail_next("edit_message", 429, retry_after=0.05)
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("go")
        await wait_texts(fake, DM_CHANNEL_ID, [answer])
        await agent.wait_idle()
    assert [c.method for c in fake.failed] == ["edit_message"]  # the 429 was served
    assert fake.calls_of("edit_message")[-1].params["content"] == answer


async def test_long_rate_limit_reaches_the_streamer_and_is_waited_on_its_clock(
    fake: FakeDiscord,
) -> None:
    # discord.py sleeps through short 429s itself; one longer than its 30 s cap is raised
    # and the streamer waits it out on our clock.
    clock = FakeClock()

    async def posted(i: int) -> None:
        await fake.wait_for("create_message")

    agent = StandInAgent(pieces=["first part, ", "second part"], between=posted)
    fake.fail_next("edit_message", 429, retry_after=45.0)
    async with discord_channel(fake, agent, clock=clock):
        await fake.dm("go")
        await agent.wait_inbounds(1, finished=True)
    assert fake.bot_texts(DM_CHANNEL_ID) == ["first part, second part"]
    assert [c.method for c in fake.failed] == ["edit_message"]
    assert 45.0 in clock.sleeps


async def test_server_error_is_retried_with_backoff(fake: FakeDiscord) -> None:
    clock = FakeClock()
    agent = StandInAgent(pieces=["done"])
    fake.fail_next("create_message", 503, times=2)
    async with discord_channel(fake, agent, clock=clock):
        await fake.dm("go")
        await agent.wait_inbounds(1, finished=True)
    assert fake.bot_texts(DM_CHANNEL_ID) == ["done"]
    assert len(fake.failed) == 2
    assert clock.sleeps[:2] == [0.5, 1.0]


@pytest.mark.parametrize("jitter", [0.0, 0.5], ids=["steady", "jittery network"])
async def test_edit_budget_is_shared_by_all_streams_of_a_channel(
    fake: FakeDiscord, jitter: float
) -> None:
    clock = FakeClock()
    fake.clock = clock  # stamp calls with the adapter's clock
    fake.network_jitter = jitter  # each call reaches Discord up to this late
    shown = 0

    def shown_calls() -> int:
        return sum(1 for c in fake.calls if c.method in POSTS)

    async def landed(i: int) -> None:  # each piece shows before the next one comes
        nonlocal shown
        shown += 1
        await fake.wait_until(lambda: shown_calls() >= shown)

    agent = StandInAgent(pieces=[f"part {i}. " for i in range(6)], between=landed)
    async with discord_channel(fake, agent, clock=clock, edit_interval_seconds=0.0):
        await fake.mention("one")
        await agent.wait_inbounds(1, finished=True)
        shown = shown_calls()
        await fake.mention("two")  # a second reply in the same channel
        await agent.wait_inbounds(2, finished=True)
    assert fake.bot_texts(CHANNEL_ID) == ["".join(agent.pieces)] * 2
    stamps = [c.at for c in fake.calls if c.method in POSTS]
    assert len(stamps) >= 12
    # Discord: at most 5 message calls per 5 s per channel (as Discord counts them, on
    # arrival), across both replies.
    assert all(stamps[i + 5] - stamps[i] >= 5.0 for i in range(len(stamps) - 5))


# --------------------------------------------------------------------------- redelivery


async def test_redelivered_message_is_answered_once_also_after_a_restart(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="first answer"), Reply(text="second answer"))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        event = await fake.dm("hello")
        await wait_texts(fake, DM_CHANNEL_ID, ["first answer"])
        # A gateway RESUME replays the MESSAGE_CREATE; and it arrives once more as is.
        await fake.resume_with_replay(("MESSAGE_CREATE", event))
        await fake.redeliver(event)
        await fake.dm("next")  # answered after the duplicates were seen
        await wait_texts(fake, DM_CHANNEL_ID, ["first answer", "second answer"])
        await agent.wait_idle()
    assert [c.params["path"] for c in fake.calls_of("gateway.connect")] == ["/gateway", "/resume"]

    fake_llm.script(Reply(text="third answer"))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.redeliver(event)  # same store, new agent and adapter
        await fake.dm("after the restart")
        await wait_texts(fake, DM_CHANNEL_ID, ["first answer", "second answer", "third answer"])
        await agent.wait_idle()
    assert len(fake_llm.requests) == 3
    assert fake_llm.unexpected == 0


# --------------------------------------------------------------------------- approvals


async def approval_prompt(fake: FakeDiscord, channel_id: str) -> dict[str, Any]:
    """Wait for the message with approval buttons in a channel."""

    def with_buttons() -> list[dict[str, Any]]:
        return [m for m in fake.channels[channel_id].messages.values() if m.get("components")]

    await fake.wait_until(lambda: bool(with_buttons()))
    return with_buttons()[0]


def button(fake: FakeDiscord, channel_id: str, message_id: str, label: str) -> str:
    found = next(b for b in fake.buttons(channel_id, message_id) if b["label"] == label)
    custom_id: str = found["custom_id"]
    return custom_id


def destructive_script(fake_llm: FakeLLM, final: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text=final),
    )


async def test_approver_click_runs_the_admin_tool(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    destructive_script(fake_llm, "Removed ./junk.")
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.mention("please clean up")
        prompt = await approval_prompt(fake, CHANNEL_ID)
        click = await fake.click(
            CHANNEL_ID, prompt["id"], button(fake, CHANNEL_ID, prompt["id"], "Approve")
        )
        await fake.wait_until(lambda: "Removed ./junk." in fake.bot_texts(CHANNEL_ID))
        await agent.wait_idle()
    answer = fake.answer_to(click)
    assert answer is not None
    assert answer["type"] == 6  # acknowledged; the prompt itself is edited
    settled = fake.message(CHANNEL_ID, prompt["id"])
    assert "Approved by alice" in settled["content"]
    assert fake.buttons(CHANNEL_ID, prompt["id"]) == []
    assert not junk.exists()


async def test_non_approver_click_is_refused_privately(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    destructive_script(fake_llm, "Kept it.")
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.mention("please clean up")
        prompt = await approval_prompt(fake, CHANNEL_ID)
        approve = button(fake, CHANNEL_ID, prompt["id"], "Approve")
        click = await fake.click(CHANNEL_ID, prompt["id"], approve, user=STRANGER)
        await fake.wait_until(lambda: fake.answer_to(click) is not None)
        refusal = fake.answer_to(click)
        assert refusal is not None
        assert refusal["type"] == 4
        assert refusal["data"]["flags"] & 64  # ephemeral: only the clicker sees it
        assert "approvers" in refusal["data"]["content"]
        assert fake.buttons(CHANNEL_ID, prompt["id"])  # still pending
        assert junk.exists()
        deny = button(fake, CHANNEL_ID, prompt["id"], "Deny")
        await fake.click(CHANNEL_ID, prompt["id"], deny, user=USER)
        await fake.wait_until(lambda: "Kept it." in fake.bot_texts(CHANNEL_ID))
        await agent.wait_idle()
    assert "Denied by alice" in fake.message(CHANNEL_ID, prompt["id"])["content"]
    assert junk.exists()


async def test_approval_timeout_denies_and_edits_the_prompt(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    destructive_script(fake_llm, "Nobody approved; nothing removed.")
    async with (
        running_agent(fake_llm, tmp_path, approval_timeout=0.3) as agent,
        discord_channel(fake, agent),
    ):
        await fake.dm("please clean up")
        await fake.wait_until(
            lambda: "Nobody approved; nothing removed." in fake.bot_texts(DM_CHANNEL_ID)
        )
        await agent.wait_idle()
    prompt = next(
        m for m in fake.channels[DM_CHANNEL_ID].messages.values() if "Approval" in m["content"]
    )
    assert "Timed out" in prompt["content"]
    assert "An approver has 1 s to answer" in prompt["content"]  # not "1 min"
    assert prompt["components"] == []
    assert junk.exists()


# --------------------------------------------------------------------------- commands


async def test_commands_are_synced_at_start_and_intents_requested(fake: FakeDiscord) -> None:
    async with discord_channel(fake, StandInAgent()):
        pass
    (sync,) = fake.calls_of("bulk_overwrite_commands")
    commands = {c["name"]: c for c in sync.params["items"]}
    assert set(commands) == set(COMMANDS)
    assert len(commands) == 15
    for name in ("provider", "goal", "memory", "instructions", "grants"):
        (option,) = commands[name]["options"]
        assert option["type"] == 3  # string
        assert not option.get("required", False)
    assert not commands["stop"].get("options")
    (identify,) = fake.calls_of("gateway.identify")
    assert identify.params["intents"] & INTENTS_NEEDED == INTENTS_NEEDED


async def test_slash_command_is_acknowledged_and_becomes_command_text(
    fake: FakeDiscord,
) -> None:
    agent = StandInAgent()
    async with discord_channel(fake, agent):
        provider = await fake.command("provider", "other")
        status = await fake.command("status", channel_id=BOT_THREAD_ID)
        inbounds = await agent.wait_inbounds(2)
    for interaction in (provider, status):
        answer = fake.answer_to(interaction)
        assert answer is not None
        assert answer["type"] == 4
        assert answer["data"]["flags"] & 64
    first, second = inbounds
    assert (first.text, first.key) == ("/provider other", ("discord", CHANNEL_ID, ""))
    assert first.user_id == USER.id
    assert (second.text, second.key) == ("/status", ("discord", CHANNEL_ID, BOT_THREAD_ID))


async def test_compact_and_stop_commands_work(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Hi alice."))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("hello")
        await wait_texts(fake, DM_CHANNEL_ID, ["Hi alice."])
        await agent.wait_idle()

        fake_llm.responder = lambda request: Reply(text="Summary: alice said hello.")
        compact = await fake.command("compact", channel_id=DM_CHANNEL_ID)
        await fake.wait_until(
            lambda: any(t.startswith("Compacted:") for t in fake.bot_texts(DM_CHANNEL_ID))
        )
        assert fake.answer_to(compact) is not None

        fake_llm.responder = None
        endless = "counting " * 400
        fake_llm.script(Reply(text=endless, chunk_size=3, chunk_delay=0.02))
        await fake.dm("count for a long time")
        await fake.wait_until(lambda: len(fake.bot_texts(DM_CHANNEL_ID)) >= 4)
        await fake.command("stop", channel_id=DM_CHANNEL_ID)
        await fake.wait_until(lambda: "Stopped." in fake.bot_texts(DM_CHANNEL_ID))
        await agent.wait_idle()
    assert endless.strip() not in fake.bot_texts(DM_CHANNEL_ID)


# --------------------------------------------------------------------------- who is answered


async def test_a_bot_is_answered_only_when_it_mentions_parley(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Looking into the alert."), Reply(text="Only for humans."))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.from_bot("ping")  # allowlisted, but a bot that does not mention Parley
        await fake.from_self("echo of myself")
        await fake.from_bot("disk full on db-1, investigate", channel_id=CHANNEL_ID, mention=True)
        await wait_texts(fake, CHANNEL_ID, ["Looking into the alert."])
        await agent.wait_idle()
        await fake.dm("hello")
        await wait_texts(fake, DM_CHANNEL_ID, ["Only for humans."])
        await agent.wait_idle()
    assert fake.bot_texts(CHANNEL_ID) == ["Looking into the alert."]
    assert len(fake_llm.requests) == 2


async def test_user_outside_the_allowlist_gets_no_answer(
    fake: FakeDiscord, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Hello alice."))
    async with running_agent(fake_llm, tmp_path) as agent, discord_channel(fake, agent):
        await fake.dm("let me in", author=STRANGER)
        await fake.mention("let me in", author=STRANGER)
        refused = await fake.command("status", user=STRANGER)
        await fake.wait_until(lambda: fake.answer_to(refused) is not None)
        await fake.dm("hello")
        await wait_texts(fake, DM_CHANNEL_ID, ["Hello alice."])
        await agent.wait_idle()
    answer = fake.answer_to(refused)
    assert answer is not None
    assert answer["data"]["flags"] & 64
    assert "not allowed" in answer["data"]["content"]
    assert fake.bot_texts(CHANNEL_ID) == []
    assert len(fake_llm.requests) == 1


async def test_channel_mentions_and_bot_threads_are_answered_in_place(
    fake: FakeDiscord,
) -> None:
    agent = StandInAgent(pieces=["ok"])
    async with discord_channel(fake, agent):
        await fake.send_message("chatter without a mention")
        await fake.thread_message(
            "chatter in a thread the bot is not in", thread_id=OTHER_THREAD_ID
        )
        await fake.mention("what is up")
        await fake.thread_message("a thread the bot is in")
        await fake.thread_message("now with a mention", thread_id=OTHER_THREAD_ID, mention=True)
        await fake.thread_message("and without again", thread_id=OTHER_THREAD_ID)
        inbounds = await agent.wait_inbounds(4, finished=True)
    assert [(i.text, i.key, i.mentions_bot) for i in inbounds] == [
        ("what is up", ("discord", CHANNEL_ID, ""), True),
        ("a thread the bot is in", ("discord", CHANNEL_ID, BOT_THREAD_ID), False),
        ("now with a mention", ("discord", CHANNEL_ID, OTHER_THREAD_ID), True),
        ("and without again", ("discord", CHANNEL_ID, OTHER_THREAD_ID), False),
    ]
    assert all(i.event_id == i.message_id != "" for i in inbounds)
    assert fake.bot_texts(CHANNEL_ID) == ["ok"]
    assert fake.bot_texts(BOT_THREAD_ID) == ["ok"]
    assert fake.bot_texts(OTHER_THREAD_ID) == ["ok", "ok"]


async def test_cron_responder_posts_into_the_keyed_channel(fake: FakeDiscord) -> None:
    async with discord_channel(fake, StandInAgent()) as channel:
        await channel.responder(("discord", CHANNEL_ID, BOT_THREAD_ID)).send("# Report\nAll good")
        await channel.responder(("discord", DM_CHANNEL_ID, "")).send("[SILENT]")
    assert fake.bot_texts(BOT_THREAD_ID) == [to_discord("# Report\nAll good")]
    assert fake.bot_texts(DM_CHANNEL_ID) == []
    assert channel.access() == f"users {USER.id}, {OTHER_BOT.id}"


def test_missing_token_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="DISCORD_BOT_TOKEN"):
        DiscordChannel(DiscordConfig(), {})


async def test_rejected_token_fails_start_with_a_channel_error(fake: FakeDiscord) -> None:
    channel = DiscordChannel(discord_config(fake), {"DISCORD_BOT_TOKEN": "wrong"})
    with pytest.raises(ChannelError, match="login failed"):
        await channel.start(StandInAgent())
    assert fake.calls_of("get_current_user")
    assert not fake.calls_of("gateway.connect")
