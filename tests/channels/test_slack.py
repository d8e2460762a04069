"""The Slack adapter end to end: real slack-bolt / slack_sdk against the fake Slack, the
real agent against the fake LLM."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from channels.slack import SlackChannel
from channels.slack_api import LIMIT_BYTES, slack_size
from channels.slack_blocks import APPROVE_ACTION, DENY_ACTION
from channels.slack_config import SlackConfig
from channels.text import split_message, to_slack_mrkdwn, utf8_len
from core.chat import AgentPort, Inbound, Responder
from core.errors import ChannelError, ConfigError, StoreError
from tests.agentkit import running_agent
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.slack import BOT_USER_ID, Envelope, FakeSlack, Posted

SECRET = "signing-secret"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as slack:
        yield slack


def config(fake: FakeSlack, **overrides: Any) -> SlackConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "base_url": fake.url,
        "allow_users": ["U1"],
        "approvers": ["U2"],
        "edit_interval_seconds": 0.05,
    }
    return SlackConfig(**(values | overrides))


def environ(fake: FakeSlack) -> dict[str, str]:
    return {
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_APP_TOKEN": fake.app_token,
        "SLACK_SIGNING_SECRET": SECRET,
    }


@asynccontextmanager
async def slack_channel(
    fake: FakeSlack,
    agent: AgentPort,
    cfg: SlackConfig | None = None,
    env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(cfg or config(fake), env or environ(fake), **kwargs)
    await channel.start(agent)
    try:
        if channel.config.mode == "socket":
            await fake.connected()
        else:
            fake.http_target = (channel.http_url, SECRET)
        yield channel
    finally:
        await channel.stop()


async def final_text(fake: FakeSlack, channel: str, thread_ts: str | None, text: str) -> Posted:
    """Wait until the bot's reply in that thread reads `text` (as mrkdwn), and return it."""
    want = to_slack_mrkdwn(text)

    def done() -> Posted | None:
        return next((m for m in fake.thread(channel, thread_ts) if m.text == want), None)

    posted: Posted = await fake.until(done, what=f"reply {text[:30]!r}")
    return posted


def llm_inputs(fake_llm: FakeLLM) -> list[str]:
    """The last user message of every request the model got."""
    found = []
    for request in fake_llm.requests:
        users = [m for m in request.json["messages"] if m["role"] == "user"]
        found.append(str(users[-1]["content"]) if users else "")
    return found


# ---- streaming, splitting, rate limits -----------------------------------------------------


async def test_dm_gets_streamed_reply_at_top_level(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = "Here is **the answer**: it streams in small pieces until it is all there."
    fake_llm.script(Reply(text=answer, chunk_size=4, chunk_delay=0.02))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        envelope = await fake.dm("hello <there> & you")
        posted = await final_text(fake, "D1", None, answer)

    assert len(fake.calls_of("chat.postMessage")) == 1
    updates = fake.calls_of("chat.update")
    assert len(updates) >= 1
    assert (
        updates[-1].params["text"] == to_slack_mrkdwn(answer) == "Here is *the answer*: it"
        " streams in small pieces until it is all there."
    )
    assert posted.thread_ts is None  # a DM is one conversation: answers stay at top level
    assert len(posted.texts) >= 2  # it grew by edits
    assert posted.texts[0] != posted.text
    assert ("D1", envelope.ts, "eyes") in fake.reactions
    assert llm_inputs(fake_llm) == ["hello <there> & you"]  # mention-free, unescaped


async def test_long_answer_with_code_is_split_within_slack_limits(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    code = "\n".join(f"    print('line {i}', x < {i} and y > 0)" for i in range(120))
    prose = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum é " * 30 for i in range(6))
    answer = f"{prose}\n\n```python\n{code}\n```\n\nThat is all."
    assert len(answer) > 6000
    fake_llm.script(Reply(text=answer, chunk_size=400, chunk_delay=0.01))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        await fake.dm("show me code")
        pieces = split_message(answer, LIMIT_BYTES, slack_size)
        want = [to_slack_mrkdwn(p) for p in pieces]
        await fake.until(
            lambda: [m.text for m in fake.thread("D1", None)] == want, what="split reply"
        )

    assert len(pieces) >= 2
    for text in want:
        assert utf8_len(text) <= 4000
        assert text.count("```") % 2 == 0  # every piece closes the fences it opens
    assert "```" in want[0] + want[1]
    assert all(c.params["text"] for c in fake.calls_of("chat.update"))


async def test_rate_limit_during_streaming_is_waited_out(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = "One two three four five six seven eight nine ten eleven twelve."
    fake_llm.script(Reply(text=answer, chunk_size=3, chunk_delay=0.02))
    fake.fail_next("chat.update", 429, retry_after=7)
    clock = FakeClock()
    async with (
        running_agent(fake_llm, tmp_path) as agent,
        slack_channel(fake, agent, clock=clock),
    ):
        await fake.dm("count")
        await final_text(fake, "D1", None, answer)

    assert 7 in clock.sleeps  # Retry-After honoured on the adapter's clock
    updates = fake.calls_of("chat.update")
    assert len(updates) >= 2  # the refused edit, then the ones that landed


async def test_final_text_survives_server_errors(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    answer = "Short answer."
    fake_llm.script(Reply(text=answer))
    fake.fail_next("chat.postMessage", 503, times=2)
    clock = FakeClock()
    async with (
        running_agent(fake_llm, tmp_path) as agent,
        slack_channel(fake, agent, clock=clock),
    ):
        await fake.dm("hi")
        await final_text(fake, "D1", None, answer)
    assert len(fake.calls_of("chat.postMessage")) >= 3


async def test_lone_surrogate_in_a_message_is_replaced_not_fatal(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="got it"))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        await fake.dm("caf\u00e9 \ud800 ok")  # JSON "\ud800": valid JSON, invalid Unicode
        await final_text(fake, "D1", None, "got it")
        await agent.wait_idle()
    assert llm_inputs(fake_llm) == ["caf\u00e9 \ufffd ok"]  # and no store write failed


# ---- who gets an answer ------------------------------------------------------------------------


async def test_redelivered_event_is_answered_once_also_after_restart(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="first answer"), Reply(text="after restart"))
    async with running_agent(fake_llm, tmp_path) as agent:
        async with slack_channel(fake, agent) as channel:
            envelope = await fake.dm("only once")
            await final_text(fake, "D1", None, "first answer")
            await fake.wait_ack(await fake.redeliver(envelope))
            await channel.settled()
        assert len(fake_llm.requests) == 1

    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent) as channel:
        await fake.wait_ack(await fake.redeliver(envelope))
        await channel.settled()
        await fake.dm("a new message")
        await final_text(fake, "D1", None, "after restart")
        await channel.settled()

    assert llm_inputs(fake_llm) == ["only once", "a new message"]
    # Answered once each: the redeliveries added nothing.
    assert [m.text for m in fake.thread("D1", None)] == ["first answer", "after restart"]


async def test_mention_answers_once_in_thread_and_follow_ups_continue_it(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="answer one"), Reply(text="answer two"))
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg) as ch:
        root = await fake.mention("what is up?", user="U3")  # app_mention + message
        await final_text(fake, "C1", root.ts, "answer one")
        await fake.channel_message("and now?", user="U3", thread_ts=root.ts)
        await final_text(fake, "C1", root.ts, "answer two")
        await fake.channel_message("chatter without a mention", user="U3")
        await fake.channel_message("another thread", user="U3", thread_ts="1600000000.000001")
        await ch.settled()

    assert llm_inputs(fake_llm) == ["what is up?", "and now?"]
    second = fake_llm.requests[1].json["messages"]
    assert any(m["role"] == "assistant" and m.get("content") == "answer one" for m in second)
    assert {m.thread_ts for m in fake.live_messages()} == {root.ts}


async def test_a_bot_is_answered_only_when_it_mentions_parley(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="looking into it"), Reply(text="for the human"))
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg) as ch:
        await fake.own_message(f"<@{BOT_USER_ID}> talking to myself")
        await fake.bot_message("hello from another bot")  # no mention: ignored
        await fake.bot_message("legacy integration", legacy=True)
        await ch.settled()
        alert = await fake.bot_message(f"<@{BOT_USER_ID}> disk full on db-1, investigate")
        await final_text(fake, "C1", alert.ts, "looking into it")
        await ch.settled()
        human = await fake.mention("hi", user="U1")
        await final_text(fake, "C1", human.ts, "for the human")
        await ch.settled()

    assert llm_inputs(fake_llm) == ["disk full on db-1, investigate", "hi"]


async def test_user_outside_the_allowlist_gets_no_answer(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="for alice"))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent) as ch:
        await fake.dm("let me in", user="U9", channel="D9")
        await fake.slash("/parley", "status", user="U9", channel="D9")
        await ch.settled()
        await fake.dm("hello", user="U1")
        await final_text(fake, "D1", None, "for alice")
        await ch.settled()

    assert llm_inputs(fake_llm) == ["hello"]
    assert not [m for m in fake.live_messages() if m.channel == "D9"]
    assert not fake.calls_of("reactions.add", where=lambda c: c.params["channel"] == "D9")


# ---- approvals ----------------------------------------------------------------------------------


async def _approval_prompt(fake: FakeSlack) -> Posted:
    await fake.wait_for("chat.postMessage", where=lambda c: bool(c.params.get("blocks")))
    return next(m for m in fake.live_messages() if m.blocks)


def _bash_rm() -> Reply:
    return Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})])


async def test_approvers_click_runs_the_admin_tool(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(_bash_rm(), Reply(text="Removed it."))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        await fake.dm("clean up junk")
        prompt = await _approval_prompt(fake)
        assert prompt.thread_ts is None  # where the DM conversation is
        assert "rm -rf ./junk" in prompt.blocks[0]["text"]["text"]  # type: ignore[index]
        await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U2")
        await final_text(fake, "D1", None, "Removed it.")

    assert not junk.exists()
    assert "Approved by bob" in prompt.text
    assert all(b["type"] != "actions" for b in prompt.blocks or [])  # buttons removed


async def test_non_approver_click_is_refused_privately(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(_bash_rm(), Reply(text="Not allowed, so I stopped."))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        await fake.dm("clean up junk")
        prompt = await _approval_prompt(fake)
        await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U1")  # the asker, no approver
        [note] = await fake.wait_for("chat.postEphemeral")
        assert note.params["user"] == "U1"
        assert "approver" in note.params["text"]
        assert junk.exists()
        assert any(b["type"] == "actions" for b in prompt.blocks or [])  # still pending
        await fake.click("D1", prompt.ts, DENY_ACTION, user="U2")
        await final_text(fake, "D1", None, "Not allowed, so I stopped.")

    assert junk.exists()
    assert "Denied by bob" in prompt.text


async def test_approval_timeout_denies_and_edits_the_prompt(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(_bash_rm(), Reply(text="Nobody answered."))
    async with (
        running_agent(fake_llm, tmp_path, approval_timeout=0.3) as agent,
        slack_channel(fake, agent),
    ):
        await fake.dm("clean up junk")
        prompt = await _approval_prompt(fake)
        await final_text(fake, "D1", None, "Nobody answered.")
        await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U2", stale=True)  # too late
        [note] = await fake.wait_for("chat.postEphemeral")

    assert junk.exists()
    assert "Timed out" in prompt.text
    assert all(b["type"] != "actions" for b in prompt.blocks or [])
    assert note.params["user"] == "U2"


# ---- commands -----------------------------------------------------------------------------------


async def test_parley_compact_slash_command(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Paris is the capital of France."))
    # Summaries, if compaction asks for one, come from here.
    fake_llm.responder = lambda _request: Reply(text="Summary: France's capital was asked.")
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        await fake.dm("capital of France?")
        await final_text(fake, "D1", None, "Paris is the capital of France.")
        await agent.wait_idle()
        command = await fake.slash("/parley", "compact")
        assert await fake.wait_ack(command) == {"envelope_id": command.envelope_id}
        await fake.until(
            lambda: any(m.text.startswith("Compacted:") for m in fake.thread("D1", None)),
            what="compaction report",
        )
    [report] = [m for m in fake.thread("D1", None) if m.text.startswith("Compacted:")]
    assert "→" in report.text


async def test_stop_as_slash_command_and_as_bang_text_in_a_thread(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    slow = "word " * 400
    fake_llm.script(
        Reply(text=slow, chunk_size=5, chunk_delay=0.05),
        Reply(text=slow, chunk_size=5, chunk_delay=0.05),
    )
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        await fake.dm("write a lot")
        await fake.wait_for("chat.postMessage")
        await fake.slash("/stop")
        await fake.until(lambda: [m for m in fake.thread("D1", None) if m.text == "Stopped."])

        root = await fake.mention("write a lot more")  # a thread: streamed natively
        await fake.wait_for("chat.appendStream", where=lambda c: c.params["channel"] == "C1")
        await fake.channel_message("!stop", thread_ts=root.ts)
        await fake.until(lambda: [m for m in fake.thread("C1", root.ts) if m.text == "Stopped."])
        # The stopped stream was ended and edited to say so: one message, no stream open.
        (answer,) = fake.thread("C1", root.ts)
        assert answer.native
        assert not answer.streaming

    assert llm_inputs(fake_llm) == ["write a lot", "write a lot more"]


async def test_slash_command_outside_the_bots_channels_answers_via_response_url(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake.not_in_channel.add("C2")
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        command = await fake.slash("/parley", "help", channel="C2")
        [reply] = await fake.wait_for("response_url")
    assert reply.params["response_type"] == "in_channel"
    assert "/compact" in reply.params["text"]
    assert command.payload["response_url"].endswith(reply.params["id"])


async def test_thread_commands_typed_at_channel_level_point_to_the_thread(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        await fake.slash("/parley", "stop", channel="C1")
        [hint] = await fake.wait_for("chat.postEphemeral")
    assert hint.params["text"] == "Type `!stop` in the thread you mean."
    assert hint.params["user"] == "U1"
    assert fake_llm.requests == []


# ---- HTTP Events API ----------------------------------------------------------------------------


async def test_http_mode_verifies_signatures(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="signed and answered"))
    cfg = config(fake, mode="http", http_port=0)
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg) as ch:
        envelope = await fake.dm("over http")
        assert envelope.http_status == 200
        await final_text(fake, "D1", None, "signed and answered")

        challenge = Envelope("check", "events_api", {"type": "url_verification", "challenge": "c"})
        assert await fake.post_http(challenge) == (200, '{"challenge": "c"}')
        forged = await fake.post_http(envelope, signature="v0=" + "0" * 64)
        stale = await fake.post_http(envelope, timestamp=int(time.time()) - 6 * 60)
        await ch.settled()

    assert forged[0] == 401
    assert stale[0] == 401
    assert len(fake_llm.requests) == 1


async def test_http_mode_slash_command_is_acked_in_the_response(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    cfg = config(fake, mode="http", http_port=0)
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        command = await fake.slash("/parley", "help")
        assert command.http_status == 200
        await fake.until(lambda: [m for m in fake.thread("D1", None) if "/compact" in m.text])


class StoreFailsOnce:
    """Stand-in agent whose store refuses the first message (a full disk, say)."""

    def __init__(self) -> None:
        self.attempts: list[Inbound] = []

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.attempts.append(inbound)
        if len(self.attempts) == 1:
            raise StoreError("disk full")
        return True


async def test_event_that_could_not_be_stored_is_not_acknowledged_and_comes_again(
    fake: FakeSlack,
) -> None:
    agent = StoreFailsOnce()
    cfg = config(fake, mode="http", http_port=0, ack_reaction=None)
    async with slack_channel(fake, agent, cfg):
        envelope = await fake.dm("keep me")
        assert envelope.http_status == 503  # Slack retries what it did not get a 200 for
        again = await fake.redeliver(envelope)
        assert again.http_status == 200
    assert [i.text for i in agent.attempts] == ["keep me", "keep me"]


# ---- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "missing"),
    [
        ("socket", "SLACK_BOT_TOKEN"),
        ("socket", "SLACK_APP_TOKEN"),
        ("http", "SLACK_SIGNING_SECRET"),
    ],
)
async def test_missing_secret_names_the_variable(fake: FakeSlack, mode: str, missing: str) -> None:
    env = {k: v for k, v in environ(fake).items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        SlackChannel(config(fake, mode=mode), env)


@pytest.mark.parametrize("wrong", ["SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"])
async def test_rejected_token_fails_start_naming_the_variable(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path, wrong: str
) -> None:
    env = environ(fake) | {wrong: "xoxb-revoked"}
    channel = SlackChannel(config(fake), env)
    async with running_agent(fake_llm, tmp_path) as agent:
        with pytest.raises(ChannelError, match=f"invalid_auth.*{wrong}"):
            await channel.start(agent)
    await channel.stop()
    assert not fake.calls_of("socket.ack")


async def test_responder_for_a_key_posts_without_an_inbound(fake: FakeSlack) -> None:
    channel = SlackChannel(config(fake, allow_channels=["C7"]), environ(fake))
    assert channel.access() == "users U1; channels C7"
    await channel.responder(("slack", "C7", "")).send("Nightly report: **green**")
    await channel.responder(("slack", "C7", "1700000000.000001")).send("in the thread")
    [top] = fake.thread("C7", None)
    [threaded] = fake.thread("C7", "1700000000.000001")
    assert (top.text, threaded.text) == ("Nightly report: *green*", "in the thread")


async def test_a_slow_bot_loop_stops_at_the_chain_cap_until_a_human_speaks(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda r: Reply(text=f"re: {r.json['messages'][-1]['content']}")
    cfg = config(fake, allow_channels=["C1"], max_bot_chain=6)
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg) as ch:
        for i in range(4):  # 3 answered: with Parley's answers, 6 messages and no human
            await fake.bot_message(f"<@{BOT_USER_ID}> alert {i}")
            await ch.settled()
            await agent.wait_idle()
        human = await fake.mention("what is going on?", user="U1")
        await final_text(fake, "C1", human.ts, "re: what is going on?")
        await ch.settled()
        await agent.wait_idle()
        alert = await fake.bot_message(f"<@{BOT_USER_ID}> alert again")
        await final_text(fake, "C1", alert.ts, "re: alert again")
        await ch.settled()
    assert llm_inputs(fake_llm) == [
        "alert 0",
        "alert 1",
        "alert 2",
        "what is going on?",
        "alert again",
    ]
