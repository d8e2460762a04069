"""A pending approval survives a restart, on each platform (docs/tools.md#approvals).

With real processes: `parley run` against the fake Telegram / Slack asks to approve
`rm -rf ./junk`, is killed with SIGKILL while it waits, and is started again. The
approver's click on the prompt posted before the crash lets the run go on and finish; with
nobody clicking, the timeout, counted from the first request, denies and the prompt says so.

In process, each adapter's side of it: after a restart (a deploy), a click that comes
before the agent has taken the run up again is answered through the store, the old prompt
is settled, and the run goes on with that answer once it is back."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from channels import discord_api
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.slack_blocks import APPROVE_ACTION
from core.agent import Agent
from core.agent.turn import RESTARTING_APPROVAL_TEXT
from core.chat import Responder
from tests.agentkit import running_agent
from tests.channels import test_discord as on_discord
from tests.channels import test_slack as on_slack
from tests.channels import test_telegram as on_telegram
from tests.channels.test_stored_before_ack import parley_run, stored_runs
from tests.fakes.discord import CHANNEL_ID, FakeDiscord
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.slack import FakeSlack, Posted
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config, telegram_run_config

ALICE = TgUser(111, "Alice", "alice")
TELEGRAM_TOKEN = "123456:TEST-token"
DONE = "Removed the junk."
DENIED = "Nobody answered, so I left it."


def junk_in(workspace: Path) -> Path:
    junk = workspace / "junk"
    junk.mkdir(parents=True)
    (junk / "old.log").write_text("stale")
    return junk


def script_rm(fake_llm: FakeLLM, final: str) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]), Reply(text=final)
    )


def approvals(db: Path) -> list[tuple[str, float, float | None, bool]]:
    """(state, requested_at, resolved_at, prompt stored) of every stored request."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT state, requested_at, resolved_at, prompt IS NOT NULL FROM approvals"
        )
        return [(r[0], r[1], r[2], bool(r[3])) for r in rows]


def prompt_stored(db: Path) -> bool:
    """The request is pending and its prompt's place is committed: a crash now is a crash
    while the run waits on the approver."""
    return db.exists() and [(r[0], r[3]) for r in approvals(db)] == [("pending", True)]


# ---- Telegram, a real process killed while it waits ----------------------------------------


def telegram_config(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, timeout: float
) -> Path:
    extra = f"""
        approvers = ["{ALICE.id}"]
        [agent]
        approval_timeout_seconds = {timeout}
        """
    return telegram_run_config(tmp_path, fake_llm.base_url, telegram.url, ALICE.id, extra)


def telegram_prompts(telegram: FakeTelegram) -> list[dict[str, Any]]:
    return [m for m in telegram.bot_messages(ALICE.id) if "Approval needed" in m["text"]]


async def crash_while_asking_on_telegram(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, config: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Start `parley run`, have it ask, SIGKILL it while it waits; returns the prompt."""
    db = tmp_path / "parley.db"
    async with parley_run(config, env) as parley:
        telegram.dm(ALICE, "please clean up")
        await telegram.wait_until(lambda: bool(telegram_prompts(telegram)), what="the prompt")
        await parley.until(lambda: prompt_stored(db), "the request stored")
        await parley.kill()
    [prompt] = telegram_prompts(telegram)
    assert "reply_markup" in prompt
    return prompt


async def test_telegram_click_on_the_prompt_from_before_a_crash_lets_the_run_finish(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_in(tmp_path / "ws")
    script_rm(fake_llm, DONE)
    env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        config = telegram_config(tmp_path, fake_llm, telegram, timeout=300)
        prompt = await crash_while_asking_on_telegram(tmp_path, fake_llm, telegram, config, env)
        assert junk.exists()

        async with parley_run(config, env) as parley:
            approve = on_telegram.button(prompt, "Approve")
            telegram.click(ALICE, ALICE.id, prompt["message_id"], approve)
            await telegram.wait_until(lambda: DONE in telegram.texts(ALICE.id), what="the answer")
            assert await parley.stop() == 0
    assert not junk.exists()
    texts = telegram.texts(ALICE.id)
    assert texts.count(DONE) == 1
    assert not [t for t in texts if "/resume" in t]  # it went on by itself
    assert telegram_prompts(telegram) == [telegram.messages[(ALICE.id, prompt["message_id"])]]
    settled = telegram.messages[(ALICE.id, prompt["message_id"])]
    assert "Approved by alice" in settled["text"]
    assert "reply_markup" not in settled
    [answer] = telegram.callback_answers.values()
    assert not answer.get("show_alert")
    assert stored_runs(tmp_path / "parley.db") == [("completed", "user")]
    assert [a[0] for a in approvals(tmp_path / "parley.db")] == ["approved"]
    assert len(fake_llm.requests) == 2


async def test_telegram_timeout_after_a_crash_counts_from_the_first_request(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    timeout, down = 4.0, 2.0
    junk = junk_in(tmp_path / "ws")
    script_rm(fake_llm, DENIED)
    env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
    db = tmp_path / "parley.db"
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        config = telegram_config(tmp_path, fake_llm, telegram, timeout=timeout)
        prompt = await crash_while_asking_on_telegram(tmp_path, fake_llm, telegram, config, env)
        await asyncio.sleep(down)  # Parley is down for a while

        async with parley_run(config, env) as parley:
            await telegram.wait_until(
                lambda: DENIED in telegram.texts(ALICE.id), timeout=20, what="the answer"
            )
            assert await parley.stop() == 0
    assert junk.exists()
    settled = telegram.messages[(ALICE.id, prompt["message_id"])]
    assert "Timed out — denied" in settled["text"]
    assert "reply_markup" not in settled
    assert len(telegram_prompts(telegram)) == 1
    assert telegram.texts(ALICE.id).count(DENIED) == 1
    [(state, asked, decided, _)] = approvals(db)
    assert state == "denied"
    assert decided is not None
    # Counted from the restart, it would have taken at least `down` + start-up + `timeout`.
    assert timeout - 0.5 < decided - asked < timeout + down - 0.1


# ---- Slack, a real process killed while it waits --------------------------------------------


async def test_slack_click_on_the_prompt_from_before_a_crash_lets_the_run_finish(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_in(tmp_path / "ws")
    script_rm(fake_llm, DONE)
    db = tmp_path / "parley.db"
    async with FakeSlack() as slack:
        config = tmp_path / "config.toml"
        config.write_text(
            fake_llm_config(
                fake_llm.base_url,
                tmp_path,
                f"""
                [channels.slack]
                enabled = true
                base_url = "{slack.url}"
                allow_users = ["U1"]
                approvers = ["U2"]
                """,
            )
        )
        env = child_env(SLACK_BOT_TOKEN=slack.bot_token, SLACK_APP_TOKEN=slack.app_token)

        async with parley_run(config, env) as parley:
            await slack.connected()
            await slack.dm("clean up junk")
            prompt: Posted = await slack.until(slack_prompt(slack), what="the prompt")
            await parley.until(lambda: prompt_stored(db), "the request stored")
            await parley.kill()
        assert junk.exists()

        async with parley_run(config, env) as parley:
            await slack.connected(sessions=2)
            await slack.click("D1", prompt.ts, APPROVE_ACTION, user="U2")
            await slack.until(
                lambda: DONE in [m.text for m in slack.live_messages()], what="the answer"
            )
            assert await parley.stop() == 0
    assert not junk.exists()
    texts = [m.text for m in slack.live_messages()]
    assert texts.count(DONE) == 1
    assert not [t for t in texts if "/resume" in t]
    assert [m.ts for m in slack.live_messages() if m.first_blocks] == [prompt.ts]
    assert "Approved by bob" in prompt.text
    assert all(b["type"] != "actions" for b in prompt.blocks or [])
    assert not slack.calls_of("chat.postEphemeral")  # nobody was told "no longer pending"
    assert stored_runs(db) == [("completed", "user")]


def slack_prompt(slack: FakeSlack) -> Callable[[], Posted | None]:
    return lambda: next((m for m in slack.live_messages() if m.blocks), None)


# ---- each adapter: a click before the agent has taken the run up again ---------------------


@asynccontextmanager
async def agent_and(
    fake_llm: FakeLLM, tmp_path: Path, channel: Callable[[Agent], Any]
) -> AsyncIterator[tuple[Agent, Any]]:
    """The real agent with one adapter (its conversations' responders), in that order."""
    adapters: list[Any] = []

    def responders(key: tuple[str, str, str]) -> Responder | None:
        responder: Responder = adapters[0].responder(key)
        return responder

    async with (
        running_agent(fake_llm, tmp_path, responders=responders) as agent,
        channel(agent) as adapter,
    ):
        adapters.append(adapter)
        yield agent, adapter
        await agent.wait_idle()


async def wait_for(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        await asyncio.sleep(0.02)


async def test_telegram_click_before_the_run_is_back_answers_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_in(tmp_path / "workspace")
    script_rm(fake_llm, DONE)
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:

        def channel(agent: Agent) -> Any:
            return on_telegram.telegram(telegram, agent)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, _):
            telegram.dm(on_telegram.ALICE, "please clean up")
            await telegram.wait_until(lambda: bool(telegram_prompts(telegram)), what="prompt")
            await wait_for(lambda: prompt_stored(tmp_path / "parley.db"), "the request stored")
            await agent.shutdown(grace=0.1)  # a deploy: the request stays pending
        [prompt] = telegram_prompts(telegram)
        assert "reply_markup" in prompt
        assert RESTARTING_APPROVAL_TEXT in telegram.texts(ALICE.id)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, _):
            approve = on_telegram.button(prompt, "Approve")
            telegram.click(on_telegram.BOB, ALICE.id, prompt["message_id"], approve)
            telegram.click(ALICE, ALICE.id, prompt["message_id"], approve)
            await telegram.wait_until(lambda: len(telegram.callback_answers) == 2)
            settled = telegram.messages[(ALICE.id, prompt["message_id"])]
            assert "Approved by alice" in settled["text"]
            assert "reply_markup" not in settled
            await agent.reconcile()  # only now is the run taken up again
            await telegram.wait_until(lambda: DONE in telegram.texts(ALICE.id), what="answer")
    refusal, answer = (telegram.callback_answers[k] for k in sorted(telegram.callback_answers))
    assert refusal["show_alert"] is True
    assert "approvers" in refusal["text"]
    assert not answer.get("show_alert")
    assert len(telegram_prompts(telegram)) == 1
    assert not junk.exists()


async def test_slack_click_before_the_run_is_back_answers_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_in(tmp_path / "workspace")
    script_rm(fake_llm, DONE)
    async with FakeSlack() as slack:

        def channel(agent: Agent) -> Any:
            return on_slack.slack_channel(slack, agent)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, _):
            await slack.dm("clean up junk")
            prompt: Posted = await slack.until(slack_prompt(slack), what="the prompt")
            await wait_for(lambda: prompt_stored(tmp_path / "parley.db"), "the request stored")
            await agent.shutdown(grace=0.1)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, adapter):
            assert isinstance(adapter, SlackChannel)
            await slack.click("D1", prompt.ts, APPROVE_ACTION, user="U2")
            await slack.until(lambda: "Approved by bob" in prompt.text, what="the settled prompt")
            await agent.reconcile()
            await slack.until(
                lambda: DONE in [m.text for m in slack.live_messages()], what="the answer"
            )
    assert all(b["type"] != "actions" for b in prompt.blocks or [])
    assert not slack.calls_of("chat.postEphemeral")
    assert not junk.exists()


async def test_discord_click_before_the_run_is_back_answers_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = junk_in(tmp_path / "workspace")
    script_rm(fake_llm, DONE)
    with discord_api.library_endpoints_restored():
        await _discord_click_before_the_run_is_back(fake_llm, tmp_path)
    assert not junk.exists()


async def _discord_click_before_the_run_is_back(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with FakeDiscord() as discord:

        def channel(agent: Agent) -> Any:
            return on_discord.discord_channel(discord, agent)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, _):
            await discord.mention("please clean up")
            prompt = await on_discord.approval_prompt(discord, CHANNEL_ID)
            await wait_for(lambda: prompt_stored(tmp_path / "parley.db"), "the request stored")
            await agent.shutdown(grace=0.1)

        async with agent_and(fake_llm, tmp_path, channel) as (agent, adapter):
            assert isinstance(adapter, DiscordChannel)
            approve = on_discord.button(discord, CHANNEL_ID, prompt["id"], "Approve")
            click = await discord.click(CHANNEL_ID, prompt["id"], approve)
            await discord.wait_until(lambda: discord.answer_to(click) is not None)
            assert discord.answer_to(click)["type"] == 6  # type: ignore[index]
            settled = discord.message(CHANNEL_ID, prompt["id"])
            assert "Approved by alice" in settled["content"]
            assert discord.buttons(CHANNEL_ID, prompt["id"]) == []
            await agent.reconcile()
            await discord.wait_until(lambda: DONE in discord.bot_texts(CHANNEL_ID))
