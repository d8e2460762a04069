"""Roles through the real adapters and their fakes (docs/governance.md#roles): a Discord
member's role ids, a Slack user's user groups (usergroups.list) and Telegram user ids give
roles; only a role that approves answers a prompt, and anyone else is told which role is
needed, and their click is audited (`approval.refused`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from channels import discord_api
from channels.discord import DiscordChannel
from channels.slack_blocks import APPROVE_ACTION
from channels.telegram import TelegramChannel
from core.audit import read_rows
from tests.agentkit import running_agent
from tests.channels.test_discord import approval_prompt, button, discord_config
from tests.channels.test_slack import config as slack_config
from tests.channels.test_slack import environ, final_text, slack_channel
from tests.channels.test_telegram import ALICE, BOB
from tests.channels.test_telegram import ENV as TG_ENV
from tests.channels.test_telegram import button as tg_button
from tests.channels.test_telegram import config as tg_config
from tests.channels.test_telegram import prompt_in as tg_prompt_in
from tests.fakes.discord import (
    CHANNEL_ID,
    ONCALL_ROLE_ID,
    STRANGER,
    TOKEN,
    USER,
    FakeDiscord,
    User,
)
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

OLGA = User("940000000000000005", "olga", roles=(ONCALL_ROLE_ID,))  # has the oncall role
DISCORD_ROLES: dict[str, Any] = {
    "admin": {"members": []},  # nobody by name: approvals are the on-call role's
    "oncall": {"approves": True, "members": [f"discord:group:{ONCALL_ROLE_ID}"]},
}


@pytest.fixture(autouse=True)
def _restore_discord_endpoints() -> Any:
    with discord_api.library_endpoints_restored():
        yield


async def test_discord_a_role_id_approves_and_others_are_told_the_role(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Removed ./junk."),
    )
    async with (
        FakeDiscord() as fake,
        running_agent(fake_llm, tmp_path, roles=DISCORD_ROLES) as agent,
    ):
        channel = DiscordChannel(
            discord_config(fake, approvers=[]), {"DISCORD_BOT_TOKEN": TOKEN}, deciders=agent.roles
        )
        await channel.start(agent)
        try:
            await _approve_as_oncall(fake, agent, junk)
        finally:
            await channel.stop()
    assert not junk.exists()


async def _approve_as_oncall(fake: FakeDiscord, agent: Any, junk: Path) -> None:
    """Strangers and the asker are refused naming the role; a member of it approves."""
    await fake.mention("please clean up")
    prompt = await approval_prompt(fake, CHANNEL_ID)
    approve = button(fake, CHANNEL_ID, prompt["id"], "Approve")
    for outsider in (STRANGER, USER):  # USER asked, but is in no approving role
        click = await fake.click(CHANNEL_ID, prompt["id"], approve, user=outsider)
        await fake.wait_until(lambda c=click: fake.answer_to(c) is not None)
        refusal = fake.answer_to(click)
        assert refusal is not None
        assert refusal["data"]["content"] == (
            "Only approvers (role admin or oncall) can answer this request."
        )
    assert junk.exists()
    await fake.click(CHANNEL_ID, prompt["id"], approve, user=OLGA)
    await fake.wait_until(lambda: "Removed ./junk." in fake.bot_texts(CHANNEL_ID))
    await agent.wait_idle()
    await agent.audit.flush()
    rows = await read_rows(agent.store)
    granted = [r for r in rows if r.kind == "approval.granted"]
    assert [r.actor for r in granted] == ["olga"]
    # A click refused is recorded too: one from outside allow_users, one from a member.
    refused = [r for r in rows if r.kind == "approval.refused"]
    assert [r.actor for r in refused] == [f"discord:{STRANGER.id}", f"discord:{USER.id}"]
    assert [r.detail["name"] for r in refused] == ["mallory", "alice"]
    assert {(r.detail["tool"], r.detail["roles"], r.conv) for r in refused} == {
        ("bash", "member", granted[0].conv)
    }
    assert refused[0].detail["request"] == granted[0].detail["request"]


async def test_slack_user_groups_give_roles_to_messages_and_clicks(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    roles = {
        "admin": {"members": ["slack:group:S_ADMINS"]},
        "viewer": {"categories": ["read"], "members": ["slack:group:S_VIEW"]},
    }
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "x.txt", "content": "x"})]),
        Reply(text="I may not write."),
    )
    async with FakeSlack() as fake:
        fake.usergroups = {"S_VIEW": ["U1"], "S_ADMINS": ["U3"]}
        cfg = slack_config(fake, approvers=[])
        async with (
            running_agent(fake_llm, tmp_path, roles=roles) as agent,
            slack_channel(fake, agent, cfg, environ(fake), deciders=agent.roles),
        ):
            await fake.dm("write x")
            await final_text(fake, "D1", None, "I may not write.")
    messages = fake_llm.requests[1].json["messages"]
    [result] = [m["content"] for m in messages if m["role"] == "tool"]
    assert "not allowed for your role (viewer)" in result
    assert not (tmp_path / "workspace" / "x.txt").exists()
    assert len(fake.calls_of("usergroups.list")) == 1  # cached


async def test_slack_a_user_group_approves(fake_llm: FakeLLM, tmp_path: Path) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    roles = {"admin": {"members": ["slack:group:S_ADMINS"]}}
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Removed it."),
    )
    async with FakeSlack() as fake:
        fake.usergroups = {"S_ADMINS": ["U3"]}
        cfg = slack_config(fake, approvers=[])
        async with (
            running_agent(fake_llm, tmp_path, roles=roles) as agent,
            slack_channel(fake, agent, cfg, environ(fake), deciders=agent.roles),
        ):
            await fake.dm("clean up junk")
            await fake.wait_for("chat.postMessage", where=lambda c: bool(c.params.get("blocks")))
            prompt = next(m for m in fake.live_messages() if m.blocks)
            await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U1")
            [note] = await fake.wait_for("chat.postEphemeral")
            assert note.params["text"] == "Only approvers (role admin) can answer this request."
            await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U3")
            await final_text(fake, "D1", None, "Removed it.")
            await agent.audit.flush()
            rows = await read_rows(agent.store)
    assert not junk.exists()
    [refused] = [r for r in rows if r.kind == "approval.refused"]
    assert (refused.actor, refused.detail["tool"], refused.detail["roles"]) == (
        "slack:U1",
        "bash",
        "member",
    )


async def test_telegram_user_ids_give_roles_to_commands_and_clicks(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Telegram: Bob's role may not switch providers nor approve; Alice's (named by user
    id, not in `approvers`) does approve."""
    roles = {
        "admin": {"members": [f"telegram:{ALICE.id}"]},
        "guest": {"commands": ["help", "status"], "members": [f"telegram:{BOB.id}"]},
    }
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Removed the junk."),
    )
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    async with (
        FakeTelegram(token=TG_ENV["TELEGRAM_BOT_TOKEN"]) as fake,
        running_agent(fake_llm, tmp_path, roles=roles) as agent,
    ):
        channel = TelegramChannel(tg_config(fake, approvers=[]), TG_ENV, deciders=agent.roles)
        await channel.start(agent)
        try:
            fake.dm(BOB, "/provider other")
            await fake.wait_until(
                lambda: any("/provider other" in t for t in fake.texts(BOB.id)), what="refusal"
            )
            [refusal] = [t for t in fake.texts(BOB.id) if "/provider other" in t]
            assert "not allowed for your role (guest)" in refusal
            assert "it needs the role admin or member" in refusal
            fake.dm(BOB, "please clean up")
            await fake.wait_until(
                lambda: any("reply_markup" in m for m in fake.bot_messages(BOB.id)), what="prompt"
            )
            prompt = tg_prompt_in(fake, BOB.id)
            fake.click(BOB, BOB.id, prompt["message_id"], tg_button(prompt, "Approve"))
            [answer] = await fake.wait_for("answerCallbackQuery")
            assert answer.params["text"] == "Only approvers (role admin) can answer this request."
            fake.click(ALICE, BOB.id, prompt["message_id"], tg_button(prompt, "Approve"))
            await fake.wait_until(lambda: "Removed the junk." in fake.texts(BOB.id), what="done")
            await agent.wait_idle()
            await agent.audit.flush()
            rows = await read_rows(agent.store)
        finally:
            await channel.stop()
    assert not junk.exists()
    [refused] = [r for r in rows if r.kind == "approval.refused"]
    assert (refused.actor, refused.detail["tool"], refused.detail["roles"]) == (
        f"telegram:{BOB.id}",
        "bash",
        "guest",
    )
