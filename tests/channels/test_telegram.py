"""The Telegram adapter end to end: the real python-telegram-bot against the fake Bot API,
with the real agent (fake LLM) where the test is about a conversation, and a small
stand-in agent where it is about the adapter alone."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from channels.telegram import TelegramChannel
from channels.telegram_config import TelegramConfig
from channels.telegram_reply import MESSAGE_LIMIT
from channels.text import split_message, to_telegram_html
from core.agent import Agent
from core.chat import Inbound, Responder
from core.clock import SystemClock
from core.command_table import COMMAND_TABLE
from core.errors import ConfigError, StoreError
from core.events import TextDelta
from tests.agentkit import running_agent
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.telegram import BOT, Call, FakeTelegram, TgUser, parse_html

ALICE = TgUser(111, "Alice", "alice")  # allowed, approver
BOB = TgUser(222, "Bob", "bob")  # allowed, not an approver
MALLORY = TgUser(333, "Mallory", "mallory")  # not allowed
OTHER_BOT = TgUser(444, "Other", "other_bot", is_bot=True)  # allowlisted, but a bot
GROUP = -1001000
FORUM = -1002000
ENV = {"TELEGRAM_BOT_TOKEN": "123456:TEST-token"}


class RecordingClock(SystemClock):
    """The real clock, remembering what it was asked to sleep."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await super().sleep(seconds)


class EchoAgent:
    """Stand-in agent for adapter-only tests: records inbounds, streams back an echo."""

    def __init__(self) -> None:
        self.inbounds: list[Inbound] = []

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.inbounds.append(inbound)
        stream = responder.stream()
        stream(TextDelta(f"echo: {inbound.text}"))
        await stream.finish(f"echo: {inbound.text}")
        return True


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=ENV["TELEGRAM_BOT_TOKEN"]) as server:
        yield server


def config(fake: FakeTelegram, **overrides: Any) -> TelegramConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "base_url": fake.url,
        "allow_users": [str(ALICE.id), str(BOB.id), str(OTHER_BOT.id), str(BOT.id)],
        "approvers": [str(ALICE.id)],
        "edit_interval_seconds": 0.05,
        # These tests are about the edit streamer (groups, and private chats without
        # drafts); tests/channels/test_telegram_drafts.py covers drafts.
        "drafts": False,
    }
    values.update(overrides)
    return TelegramConfig(**values)


@asynccontextmanager
async def telegram(
    fake: FakeTelegram,
    agent: Any,
    *,
    environ: dict[str, str] | None = None,
    clock: Any = None,
    **overrides: Any,
) -> AsyncIterator[TelegramChannel]:
    channel = TelegramChannel(config(fake, **overrides), environ or ENV, clock=clock)
    await channel.start(agent)
    try:
        yield channel
    finally:
        await channel.stop()


@asynccontextmanager
async def agent_on_telegram(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
    *,
    approval_timeout: float = 300.0,
    **kw: Any,
) -> AsyncIterator[tuple[Agent, TelegramChannel]]:
    async with (
        running_agent(fake_llm, tmp_path, approval_timeout=approval_timeout) as agent,
        telegram(fake, agent, **kw) as channel,
    ):
        yield agent, channel
        # Runs post their final text through the adapter: let them end before it stops.
        await agent.wait_idle()


def visible(markdown: str) -> str:
    """What a Telegram user sees of `markdown` sent as HTML."""
    return parse_html(to_telegram_html(markdown))[0]


async def wait_text(fake: FakeTelegram, chat_id: int, text: str) -> None:
    await fake.wait_until(lambda: text in fake.texts(chat_id), what=f"message {text!r}")


def sent_to(fake: FakeTelegram, chat_id: int, method: str = "sendMessage") -> list[Call]:
    return [c for c in fake.calls_of(method) if c.params.get("chat_id") == chat_id]


def prompt_in(fake: FakeTelegram, chat_id: int) -> dict[str, Any]:
    prompts = [m for m in fake.bot_messages(chat_id) if "reply_markup" in m]
    assert len(prompts) == 1
    return prompts[0]


def button(prompt: dict[str, Any], label: str) -> str:
    for row in prompt["reply_markup"]["inline_keyboard"]:
        for key in row:
            if label in key["text"]:
                return str(key["callback_data"])
    raise AssertionError(f"no {label} button in {prompt['reply_markup']}")


# ---- streaming and delivery -----------------------------------------------------------------

PLAN = (
    "Here is **the plan**:\n\n"
    + "\n".join(f"- step {i}: do the thing number {i}" for i in range(12))
    + "\n\nDone."
)


async def test_dm_reply_streams_one_message_then_final_html(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text=PLAN, chunk_size=6, chunk_delay=0.01))
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        fake.dm(ALICE, "make a plan")
        await wait_text(fake, ALICE.id, visible(PLAN))
        await agent.wait_idle()
    posts = sent_to(fake, ALICE.id)
    assert len(posts) == 1
    assert "parse_mode" not in posts[0].params  # intermediate text goes plain
    edits = [c for c in sent_to(fake, ALICE.id, "editMessageText") if c.status == 200]
    assert edits
    assert edits[-1].params["parse_mode"] == "HTML"
    assert edits[-1].params["text"] == to_telegram_html(PLAN)
    assert fake.texts(ALICE.id) == [visible(PLAN)]
    assert sent_to(fake, ALICE.id, "sendChatAction")[0].params["action"] == "typing"
    assert "make a plan" in str(fake_llm.requests[0].json)


async def test_long_answer_with_code_block_is_split_without_breaking_the_fence(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    intro = " ".join(f"Intro sentence {i} explains the change." for i in range(40))
    code = "\n".join(
        f"    result_{i:03d} = compute(value_{i:03d}) + offset  # line {i}" for i in range(60)
    )
    outro = " ".join(f"Closing remark {i}." for i in range(60))
    answer = f"{intro}\n\n```python\n{code}\n```\n\n{outro}"
    assert 5500 < len(answer) < 6500
    fake_llm.script(Reply(text=answer, chunk_size=400))
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        fake.dm(ALICE, "write the code")
        pieces = split_message(answer, MESSAGE_LIMIT)
        await fake.wait_until(
            lambda: fake.texts(ALICE.id) == [visible(p) for p in pieces], what="final pieces"
        )
        await agent.wait_idle()
    assert len(pieces) == 2
    assert pieces[0].rstrip().endswith("```")
    assert pieces[1].startswith("```python\n")
    messages = fake.bot_messages(ALICE.id)
    for message in messages:
        assert len(message["text"]) <= MESSAGE_LIMIT
        assert any(
            e["type"] == "pre" and e.get("language") == "python" for e in message["entities"]
        )
    shown = "\n".join(m["text"] for m in messages)
    assert all(line.strip() in shown for line in code.splitlines())


async def test_429_during_streaming_is_waited_out(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text=PLAN, chunk_size=6, chunk_delay=0.01))
    fake.fail_next("editMessageText", 429, retry_after=1)
    clock = RecordingClock()
    async with agent_on_telegram(fake, fake_llm, tmp_path, clock=clock) as (agent, _):
        fake.dm(ALICE, "make a plan")
        await wait_text(fake, ALICE.id, visible(PLAN))
        await agent.wait_idle()
    [limited] = [c for c in fake.calls if c.status == 429]
    assert 1.0 in clock.sleeps
    during = [
        c
        for c in fake.calls
        if c.method in ("sendMessage", "editMessageText") and limited.at < c.at < limited.at + 0.9
    ]
    assert during == []  # nothing sent to the chat while waiting
    assert fake.texts(ALICE.id) == [visible(PLAN)]


async def test_5xx_on_a_post_is_retried(fake: FakeTelegram) -> None:
    clock = FakeClock()
    fake.add_chat(GROUP)
    fake.fail_next("sendMessage", 502)
    async with telegram(fake, EchoAgent(), clock=clock) as channel:
        await channel.responder(("telegram", str(GROUP), "")).send("report ready")
    assert [c.status for c in sent_to(fake, GROUP)] == [502, 200]
    assert clock.sleeps == [0.5]
    assert fake.texts(GROUP) == ["report ready"]


async def test_html_rejected_falls_back_to_plain_text(fake: FakeTelegram) -> None:
    fake.add_chat(GROUP)
    fake.fail_next(
        "sendMessage",
        400,
        description="Bad Request: can't parse entities: Unsupported start tag at byte offset 3",
        where=lambda params: params.get("parse_mode") == "HTML",
    )
    async with telegram(fake, EchoAgent()) as channel:
        await channel.responder(("telegram", str(GROUP), "")).send("**bold** and <x>")
    assert [c.status for c in sent_to(fake, GROUP)] == [400, 200]
    assert fake.texts(GROUP) == ["**bold** and <x>"]


async def test_message_not_modified_is_not_an_error(fake: FakeTelegram) -> None:
    fake.add_chat(GROUP)
    async with telegram(fake, EchoAgent()) as channel:
        stream = channel.responder(("telegram", str(GROUP), "")).stream()
        stream(TextDelta("Hello world"))
        await fake.wait_for("sendMessage")
        await stream.finish("Hello world")  # the HTML edit changes nothing: Telegram says so
    [edit] = fake.calls_of("editMessageText")
    assert edit.status == 400
    assert edit.params["parse_mode"] == "HTML"
    assert fake.texts(GROUP) == ["Hello world"]


async def test_cron_responder_posts_into_the_forum_topic(fake: FakeTelegram) -> None:
    fake.add_chat(FORUM, forum=True)
    async with telegram(fake, EchoAgent()) as channel:
        await channel.responder(("telegram", str(FORUM), "77")).send("nightly report")
    [post] = sent_to(fake, FORUM)
    assert post.params["message_thread_id"] == 77
    assert "reply_parameters" not in post.params


# ---- de-duplication ------------------------------------------------------------------------


async def test_redelivered_update_is_answered_once_also_after_restart(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="first"), Reply(text="second"))
    async with agent_on_telegram(fake, fake_llm, tmp_path):
        update = fake.dm(ALICE, "one")
        await wait_text(fake, ALICE.id, "first")
        fake.redeliver(update)
        fake.dm(ALICE, "two")  # same conversation, so handled after the redelivery
        await wait_text(fake, ALICE.id, "second")
    fake_llm.script(Reply(text="third"))
    async with agent_on_telegram(fake, fake_llm, tmp_path):  # same store file
        fake.redeliver(update)
        fake.dm(ALICE, "three")
        await wait_text(fake, ALICE.id, "third")
    assert len(fake_llm.requests) == 3
    assert fake.texts(ALICE.id) == ["first", "second", "third"]
    # Both redeliveries reached the agent, which recognised them.
    polled = [u["update_id"] for c in fake.calls_of("getUpdates") for u in c.result or []]
    assert polled.count(update["update_id"]) == 3
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    duplicates = [e["id"] for e in events if e["event"] == "channel.event.duplicate"]
    assert duplicates == [str(update["update_id"])] * 2


async def test_lone_surrogates_in_updates_are_replaced_not_fatal(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="got it"), Reply(text="got that too"))
    async with agent_on_telegram(fake, fake_llm, tmp_path):
        fake.dm(ALICE, "caf\u00e9 \ud800 ok")  # JSON "\ud800": valid JSON, invalid Unicode
        await wait_text(fake, ALICE.id, "got it")
        fake.group_message(GROUP, ALICE, "\udfff and a mention", mention=True)  # an entity
        await wait_text(fake, GROUP, "got that too")
    users = [
        [m["content"] for m in request.json["messages"] if m["role"] == "user"][-1]
        for request in fake_llm.requests
    ]
    assert users == ["caf\u00e9 \ufffd ok", "\ufffd and a mention"]  # no store write failed


# ---- approvals -----------------------------------------------------------------------------


def junk_dir(tmp_path: Path) -> Path:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    (junk / "old.log").write_text("stale")
    return junk


def script_rm(fake_llm: FakeLLM, final: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]), Reply(text=final)
    )


async def test_approver_click_runs_the_admin_tool(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    script_rm(fake_llm, "Removed the junk.")
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        fake.dm(ALICE, "please clean up")
        await fake.wait_until(
            lambda: any("reply_markup" in m for m in fake.bot_messages(ALICE.id)), what="prompt"
        )
        prompt = prompt_in(fake, ALICE.id)
        assert "bash" in prompt["text"]
        fake.click(ALICE, ALICE.id, prompt["message_id"], button(prompt, "Approve"))
        await wait_text(fake, ALICE.id, "Removed the junk.")
        await agent.wait_idle()
    assert not junk.exists()
    [answer] = fake.calls_of("answerCallbackQuery")
    assert not answer.params.get("show_alert")
    settled = fake.messages[(ALICE.id, prompt["message_id"])]
    assert "Approved by alice" in settled["text"]
    assert "reply_markup" not in settled


async def test_non_approver_click_is_refused_privately(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    script_rm(fake_llm, "Left it alone.")
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        trigger = fake.group_message(GROUP, ALICE, "please clean up", mention=True)
        await fake.wait_until(
            lambda: any("reply_markup" in m for m in fake.bot_messages(GROUP)), what="prompt"
        )
        prompt = prompt_in(fake, GROUP)
        assert prompt["reply_to_message"]["message_id"] == trigger["message"]["message_id"]
        fake.click(BOB, GROUP, prompt["message_id"], button(prompt, "Approve"))
        [refusal] = await fake.wait_for("answerCallbackQuery")
        assert refusal.params["show_alert"] is True
        assert "approvers" in refusal.params["text"]
        assert "reply_markup" in fake.messages[(GROUP, prompt["message_id"])]  # still pending
        fake.click(ALICE, GROUP, prompt["message_id"], button(prompt, "Deny"))
        await wait_text(fake, GROUP, "Left it alone.")
        await agent.wait_idle()
    assert junk.exists()
    settled = fake.messages[(GROUP, prompt["message_id"])]
    assert "Denied by alice" in settled["text"]
    assert "reply_markup" not in settled


async def test_approval_timeout_denies_and_edits_the_prompt(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_dir(tmp_path)
    script_rm(fake_llm, "Nobody answered, so I did nothing.")
    async with agent_on_telegram(fake, fake_llm, tmp_path, approval_timeout=0.3) as (agent, _):
        fake.dm(ALICE, "please clean up")
        await wait_text(fake, ALICE.id, "Nobody answered, so I did nothing.")
        await agent.wait_idle()
    assert junk.exists()
    prompt = next(m for m in fake.bot_messages(ALICE.id) if "Approval" in m["text"])
    assert "Timed out" in prompt["text"]
    assert "reply_markup" not in prompt


# ---- commands ------------------------------------------------------------------------------


async def test_compact_command(fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="An answer."), Reply(text="Summary: we said hello."))
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        fake.dm(ALICE, "hello")
        await wait_text(fake, ALICE.id, "An answer.")
        await agent.wait_idle()
        fake.command(ALICE, "compact")
        await fake.wait_until(
            lambda: any(t.startswith("Compacted:") for t in fake.texts(ALICE.id)),
            what="compaction report",
        )
    assert "Compacting the conversation…" in fake.texts(ALICE.id)


async def test_stop_command_stops_the_running_turn(
    fake: FakeTelegram, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="blah " * 400, chunk_size=5, chunk_delay=0.02))
    async with agent_on_telegram(fake, fake_llm, tmp_path) as (agent, _):
        fake.dm(ALICE, "talk a lot")
        await fake.wait_for("sendMessage", where=lambda c: c.params["chat_id"] == ALICE.id)
        fake.command(ALICE, "stop")
        await fake.wait_until(lambda: "Stopped." in fake.texts(ALICE.id), what="stopped run")
        await agent.wait_idle()
    # The run's preview became "Stopped."; the command did not say it a second time.
    assert fake.texts(ALICE.id).count("Stopped.") == 1
    assert not any("blah" in t for t in fake.texts(ALICE.id))


async def test_commands_are_registered_and_normalised(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        assert [c["command"] for c in fake.commands] == [spec.name for spec in COMMAND_TABLE]
        fake.command(ALICE, "status", at=BOT.username, chat_id=GROUP)
        fake.command(ALICE, "help", at="other_bot", chat_id=GROUP)  # not for us
        fake.command(ALICE, "goal", "create ship the release --auto")
        fake.command(ALICE, "start")
        await wait_text(fake, ALICE.id, "echo: /help")
        await wait_text(fake, GROUP, "echo: /status")
    assert sorted(i.text for i in agent.inbounds) == [
        "/goal create ship the release --auto",
        "/help",
        "/status",
    ]


# ---- who gets an answer --------------------------------------------------------------------


async def test_a_bot_is_answered_only_when_it_mentions_parley(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        fake.add_chat(GROUP)
        fake.own_message(GROUP, f"@{BOT.username} talking to myself")
        fake.group_message(GROUP, OTHER_BOT, "ping pong")  # no mention: ignored
        fake.dm(OTHER_BOT, "hello bot")  # a DM is no mention either
        fake.group_message(GROUP, OTHER_BOT, "disk full, investigate", mention=True)
        fake.dm(ALICE, "ping")
        await wait_text(fake, ALICE.id, "echo: ping")
        await wait_text(fake, GROUP, "echo: disk full, investigate")
    assert [i.user_id for i in agent.inbounds] == [str(OTHER_BOT.id), str(ALICE.id)]
    assert not sent_to(fake, OTHER_BOT.id)


async def test_user_outside_the_allowlist_gets_no_answer(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        fake.dm(MALLORY, "let me in")
        fake.group_message(GROUP, MALLORY, "let me in", mention=True)
        fake.dm(ALICE, "ping")
        await wait_text(fake, ALICE.id, "echo: ping")
    assert [i.user_id for i in agent.inbounds] == [str(ALICE.id)]
    assert not sent_to(fake, MALLORY.id)
    assert not sent_to(fake, GROUP)


async def test_groups_answer_mentions_and_replies_to_the_bot_only(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        fake.group_message(GROUP, ALICE, "just chatting")
        asked = fake.group_message(GROUP, ALICE, "what is up?", mention=True)
        await wait_text(fake, GROUP, "echo: what is up?")
        [answer] = fake.bot_messages(GROUP)
        fake.group_message(GROUP, BOB, "and then?", reply_to=answer["message_id"])
        await wait_text(fake, GROUP, "echo: and then?")
    first, second = agent.inbounds
    assert (first.text, first.mentions_bot, first.is_dm) == ("what is up?", True, False)
    assert (first.channel_id, first.thread_id) == (str(GROUP), "")
    assert first.event_id == str(asked["update_id"])
    assert (second.text, second.mentions_bot) == ("and then?", False)
    [reply, _] = sent_to(fake, GROUP)
    assert reply.params["reply_parameters"]["message_id"] == asked["message"]["message_id"]


async def test_another_bots_command_in_a_group_is_not_for_us(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        fake.command(ALICE, "roll", "2d6", chat_id=GROUP)  # untargeted: Telegram sends it
        fake.command(ALICE, "status", chat_id=GROUP)  # ours, even without @ourbot
        await wait_text(fake, GROUP, "echo: /status")
    assert [i.text for i in agent.inbounds] == ["/status"]


async def test_forum_topic_is_the_thread_and_replies_stay_in_it(fake: FakeTelegram) -> None:
    agent = EchoAgent()
    async with telegram(fake, agent):
        fake.group_message(FORUM, ALICE, "in the topic", mention=True, thread_id=77)
        await wait_text(fake, FORUM, "echo: in the topic")
    [inbound] = agent.inbounds
    assert inbound.key == ("telegram", str(FORUM), "77")
    [post] = sent_to(fake, FORUM)
    assert post.params["message_thread_id"] == 77
    assert fake.bot_messages(FORUM)[0]["message_thread_id"] == 77


# ---- webhook -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_webhook_checks_the_secret_token(fake: FakeTelegram) -> None:
    port = free_port()
    environ = ENV | {"TELEGRAM_WEBHOOK_SECRET": "s3cret-Token_1"}
    agent = EchoAgent()
    hook = f"http://127.0.0.1:{port}/telegram/hook"
    async with telegram(
        fake, agent, environ=environ, mode="webhook", webhook_url=hook, webhook_port=port
    ):
        [registered] = fake.calls_of("setWebhook")
        assert registered.params["url"] == hook
        assert registered.params["secret_token"] == "s3cret-Token_1"
        update = fake.dm(ALICE, "via webhook")
        await wait_text(fake, ALICE.id, "echo: via webhook")
        forged = {"update_id": 424242, "message": dict(update["message"], text="forged")}
        assert await fake.push_webhook(forged, secret="wrong") == 401
        assert await fake.push_webhook(forged, secret="") == 401
        fake.dm(ALICE, "after")
        await wait_text(fake, ALICE.id, "echo: after")
    assert [i.text for i in agent.inbounds] == ["via webhook", "after"]
    assert not fake.calls_of("getUpdates")


class StoreFailsOnce(EchoAgent):
    """Stand-in agent whose store refuses the first message (a full disk, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        self.attempts += 1
        if self.attempts == 1:
            raise StoreError("disk full")
        return await super().submit(inbound, responder)


async def test_polling_confirms_an_update_only_once_it_is_stored(fake: FakeTelegram) -> None:
    agent = StoreFailsOnce()
    async with telegram(fake, agent):
        update = fake.dm(ALICE, "keep me")
        await wait_text(fake, ALICE.id, "echo: keep me")  # taken in again on the next poll
    assert agent.attempts == 2
    uid = update["update_id"]
    polls = fake.calls_of("getUpdates")
    fetches = [i for i, call in enumerate(polls) if call.result]
    assert len(fetches) == 2
    offsets = [int(call.params.get("offset") or 0) for call in polls]
    assert all(offset <= uid for offset in offsets[: fetches[-1] + 1])  # kept until stored
    assert offsets[-1] == uid + 1  # then confirmed (at the latest when the channel stops)


async def test_polling_waits_out_429_and_backs_off_on_failures_on_its_clock(
    fake: FakeTelegram,
) -> None:
    clock = FakeClock()
    fake.fail_next("getUpdates", 429, retry_after=5)
    fake.fail_next("getUpdates", 502, times=2)
    fake.fail_next("getUpdates", 409, description="Conflict: terminated by other getUpdates")
    async with telegram(fake, EchoAgent(), clock=clock):
        fake.dm(ALICE, "still there?")
        await wait_text(fake, ALICE.id, "echo: still there?")
    assert [c.status for c in fake.calls_of("getUpdates")][:5] == [429, 502, 502, 409, 200]
    assert clock.sleeps[:4] == [5.0, 1.0, 2.0, 4.0]  # a 409 passes too: it is waited out


async def test_webhook_answers_500_for_an_update_it_could_not_store(fake: FakeTelegram) -> None:
    port = free_port()
    environ = ENV | {"TELEGRAM_WEBHOOK_SECRET": "s3cret"}
    agent = StoreFailsOnce()
    hook = f"http://127.0.0.1:{port}/telegram/hook"
    async with telegram(
        fake, agent, environ=environ, mode="webhook", webhook_url=hook, webhook_port=port
    ):
        update = fake.dm(ALICE, "keep me")
        await fake.wait_until(lambda: fake.deliveries, what="the webhook's answer")
        fake.redeliver(update)  # Telegram retries what it did not get a 200 for
        await wait_text(fake, ALICE.id, "echo: keep me")
        await fake.wait_until(lambda: len(fake.deliveries) == 2, what="the second answer")
    assert fake.deliveries == [(update["update_id"], 500), (update["update_id"], 200)]


# ---- construction --------------------------------------------------------------------------


async def test_missing_token_or_webhook_secret_is_a_config_error(fake: FakeTelegram) -> None:
    with pytest.raises(ConfigError, match="TELEGRAM_BOT_TOKEN"):
        TelegramChannel(config(fake), {})
    with pytest.raises(ConfigError, match="TELEGRAM_WEBHOOK_SECRET"):
        TelegramChannel(config(fake, mode="webhook", webhook_url="https://bot.example.com/tg"), ENV)
    channel = TelegramChannel(config(fake, allow_users=["111"]), ENV)
    assert channel.access() == "users 111"


async def test_a_rejected_token_is_a_config_error_without_the_token(fake: FakeTelegram) -> None:
    channel = TelegramChannel(config(fake), {"TELEGRAM_BOT_TOKEN": "999:wrong-token"})
    with pytest.raises(ConfigError, match="TELEGRAM_BOT_TOKEN") as caught:
        await channel.start(EchoAgent())
    assert "wrong-token" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert [c.status for c in fake.calls] == [401]
