"""Roles (docs/governance.md#roles) through the real agent: each refusal — a tool by
category, a tool by name, a command — tells the sender which role is needed, is recorded
in the audit log, and without `[roles]` everything works as before roles existed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.config import parse_config
from core.audit import read_rows
from core.errors import ConfigError
from core.roles import Roles, RolesConfig
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.delegatekit import PARENT, Scripts, delegate
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

SLACK = ("slack", "C1", "")
ROLES: dict[str, Any] = {
    "viewer": {
        "categories": ["read"],
        "tools": ["write_*"],  # write_file by name, though its category is not allowed
        "deny_tools": ["list_directory"],
        "commands": ["help", "status", "goal"],
        "deny_commands": ["goal --auto"],
        "members": ["slack:U2", "slack:group:S_VIEWERS"],
    },
}
CHANNELS = {"slack": {"approvers": ["U1"]}}


def tool_results(fake_llm: FakeLLM, request: int) -> list[str]:
    messages = fake_llm.requests[request].json["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


async def _audit(agent: Any, kind: str) -> list[Any]:
    await agent.audit.flush()
    return [r for r in await read_rows(agent.store) if r.kind == kind]


async def test_a_tool_outside_the_roles_categories_is_refused_naming_the_role(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "echo hi > made.txt"})]),
        Reply(text="I may not run that."),
    )
    async with running_agent(fake_llm, tmp_path, roles=ROLES, channels=CHANNELS) as agent:
        report = await agent.run(inbound("make a file", key=SLACK, user_id="U2"))
        assert report.state == "completed"
        [result] = tool_results(fake_llm, 1)
        assert "not allowed for your role (viewer)" in result
        assert "it needs the role admin or member" in result
        assert not (tmp_path / "workspace" / "made.txt").exists()
        [row] = await _audit(agent, "tool.refused")
    assert row.actor == "slack:U2"
    assert (row.detail["tool"], row.detail["by"], row.detail["roles"]) == ("bash", "role", "viewer")


async def test_a_tool_named_by_the_role_runs_and_a_denied_one_does_not(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("write_file", {"path": "note.txt", "content": "ok"}),
                ToolCallSpec("list_directory", {"path": "."}),
            ]
        ),
        Reply(text="Done."),
    )
    async with running_agent(fake_llm, tmp_path, roles=ROLES, channels=CHANNELS) as agent:
        await agent.run(inbound("note it", key=SLACK, user_id="U2"))
        written, listed = tool_results(fake_llm, 1)
        assert "error" not in written  # write_file: named by the role's `tools`
        assert (tmp_path / "workspace" / "note.txt").read_text() == "ok"
        assert "`list_directory` (read) is not allowed for your role (viewer)" in listed
        [row] = await _audit(agent, "tool.refused")
    assert row.detail["tool"] == "list_directory"


async def test_a_user_group_gives_its_role(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "true"})]), Reply(text="No.")
    )
    async with running_agent(fake_llm, tmp_path, roles=ROLES, channels=CHANNELS) as agent:
        await agent.run(inbound("go", key=SLACK, user_id="U7", groups=("S_VIEWERS",)))
    [result] = tool_results(fake_llm, 1)
    assert "your role (viewer)" in result


def tools_offered(fake_llm: FakeLLM, request: int) -> set[str]:
    return {t["function"]["name"] for t in fake_llm.requests[request].json["tools"]}


async def test_a_channel_run_is_offered_only_the_tools_its_role_allows(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """The viewer is not offered `bash` (write) or `list_directory` (denied by name), but
    is `write_file` (named by the role); an admin in the same channel is offered all."""
    fake_llm.script(Reply(text="viewer"), Reply(text="admin"))
    async with running_agent(fake_llm, tmp_path, roles=ROLES, channels=CHANNELS) as agent:
        await agent.run(inbound("hi", key=SLACK, user_id="U2"))
        await agent.run(inbound("hi", key=SLACK, user_id="U1"))
    viewer, admin = tools_offered(fake_llm, 0), tools_offered(fake_llm, 1)
    assert {"read_file", "write_file"} <= viewer
    assert not viewer & {"bash", "list_directory", "delegate"}
    assert viewer < admin
    assert {"bash", "list_directory", "delegate"} <= admin


async def test_a_tool_not_offered_stays_refused_when_a_call_escalates_its_category(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A role with `admin` but not `write` is not offered `bash` (a write tool); a
    destructive command (an admin call) by name is refused too, never asked about."""
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Not removed."),
    )
    roles = {"default": "odd", "odd": {"categories": ["read", "admin"]}}
    (tmp_path / "workspace" / "junk").mkdir(parents=True)
    chat = RecordingResponder(approve_with=True)
    async with running_agent(fake_llm, tmp_path, roles=roles, channels=CHANNELS) as agent:
        await agent.run(inbound("clean up", key=SLACK, user_id="U5"), chat)
        assert await _audit(agent, "approval.asked") == []
    assert "bash" not in tools_offered(fake_llm, 0)
    [result] = tool_results(fake_llm, 1)
    assert "`bash` (write) is not allowed for your role (odd)" in result
    assert (tmp_path / "workspace" / "junk").is_dir()


async def test_a_child_run_gets_no_tool_its_parents_role_refuses(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A role that may delegate but not write: its child is not offered `bash`, and a
    task asking for `bash` is refused naming the role."""
    scripts = Scripts()
    fake_llm.responder = scripts
    scripts.parent.extend(
        [
            Reply(tool_calls=[delegate({"instruction": "beta: run it", "tools": ["bash"]})]),
            Reply(tool_calls=[delegate("alpha: look around", call_id="d2")]),
            Reply(text="done"),
        ]
    )
    scripts.child("alpha", Reply(text="alpha looked"))
    roles = {"planner": {"categories": ["read"], "tools": ["delegate"], "members": ["slack:U3"]}}
    async with running_agent(fake_llm, tmp_path, roles=roles, channels=CHANNELS) as agent:
        report = await agent.run(inbound("plan", key=SLACK, user_id="U3"))
    assert report.state == "completed"
    assert "delegate" in scripts.tools_offered(PARENT)
    assert "bash" not in scripts.tools_offered(PARENT)
    [refused] = scripts.tool_results(PARENT, 1).values()
    assert "a child run cannot have `bash`" in refused
    assert "not allowed for your role (planner)" in refused
    offered = scripts.tools_offered("alpha")
    assert "read_file" in offered
    assert not {"bash", "write_file"} & set(offered)


async def test_a_command_the_role_lacks_is_refused_naming_the_role(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, roles=ROLES, channels=CHANNELS) as agent:
        await agent.submit(inbound("/provider other", key=SLACK, user_id="U2"), chat)
        await agent.submit(inbound("/goal create ship it --auto", key=SLACK, user_id="U2"), chat)
        await agent.submit(inbound("/goal create ship it", key=SLACK, user_id="U2"), chat)
        assert chat.sent[0] == (
            "`/provider other` is not allowed for your role (viewer); it needs the role "
            "admin or member."
        )
        assert chat.sent[1].startswith("`/goal create ship it --auto` is not allowed")
        assert chat.sent[2] == "Goal set: ship it"  # /goal itself is allowed
        assert await agent.provider_for(SLACK) == "fake"  # unchanged
        refused = await _audit(agent, "command.refused")
    assert [r.detail["command"] for r in refused] == [
        "/provider other",
        "/goal create ship it --auto",
    ]
    assert refused[0].actor == "slack:U2"


async def test_a_command_refused_by_its_own_rule_is_audited_as_refused(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`/budget set` is open to the member role but for admins only inside: a member's is
    audited as `command.refused` with why, an admin's as `command`."""
    chat = RecordingResponder()
    budgets = {"per_channel_month": 1.0}
    async with running_agent(fake_llm, tmp_path, channels=CHANNELS, budgets=budgets) as agent:
        await agent.submit(
            inbound("/budget set per_channel_month 50", key=SLACK, user_id="U5"), chat
        )
        assert chat.sent == ["Only admins (this channel's approvers) can change a budget."]
        await agent.submit(
            inbound("/budget set per_channel_month 2", key=SLACK, user_id="U1"), chat
        )
        assert chat.sent[-1] == "The per_channel_month budget is now $2.00."
        [refused] = await _audit(agent, "command.refused")
        [done] = await _audit(agent, "command")
    assert (refused.actor, refused.detail["command"], refused.detail["roles"]) == (
        "slack:U5",
        "/budget set per_channel_month 50",
        "member",
    )
    assert refused.detail["reason"] == chat.sent[0]
    assert (done.actor, done.detail["command"]) == ("slack:U1", "/budget set per_channel_month 2")
    assert "reason" not in done.detail


async def test_without_roles_everyone_keeps_todays_permissions(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """The default role is `member`: every command but choosing instructions, every tool
    (admin tools ask an approver, as before); an admin command is audited."""
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "x"})]),
        Reply(text="Written."),
    )
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, channels=CHANNELS) as agent:
        await agent.submit(inbound("/provider other", key=SLACK, user_id="U5"), chat)
        assert chat.sent == ["This channel now uses other."]
        report = await agent.run(inbound("write", key=SLACK, user_id="U5"))
        assert report.state == "completed"
        assert (tmp_path / "workspace" / "a.txt").read_text() == "x"
        [row] = await _audit(agent, "command")
    assert (row.actor, row.detail["command"], row.detail["roles"]) == (
        "slack:U5",
        "/provider other",
        "member",
    )


async def test_approvals_are_audited_with_who_and_the_exact_call(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"})]),
        Reply(text="Not removed."),
    )
    chat = RecordingResponder(approve_with=False)
    async with running_agent(fake_llm, tmp_path, channels=CHANNELS) as agent:
        await agent.run(inbound("clean up", key=SLACK, user_id="U5"), chat)
        [asked] = await _audit(agent, "approval.asked")
        [denied] = await _audit(agent, "approval.denied")
    assert (asked.actor, asked.detail["tool"]) == ("slack:U5", "bash")
    assert denied.detail["request"] == asked.detail["request"]
    assert json.loads(asked.detail["call"].removeprefix("bash ")) == {"command": "rm -rf ./junk"}


def test_reserved_commands_may_be_named_before_they_exist(tmp_path: Path) -> None:
    roles = {"finance": {"commands": ["/budget", "usage"], "members": ["telegram:42"]}}
    config = parse_config({**_base(tmp_path), "roles": roles})
    person = Roles(config.roles).of("telegram", "42")
    assert person.allows_command("budget", "raise 10")
    assert not person.allows_command("provider", "")


def test_the_terminal_user_has_the_terminal_role() -> None:
    roles = Roles(RolesConfig.model_validate({"terminal": "member"}))
    person = roles.of("console", "")
    assert person.names == "member"
    assert not person.approves
    assert Roles().of("console", "").approves  # default: admin


@pytest.mark.parametrize(
    ("roles", "key", "message"),
    [
        ({"ops": {"categories": ["root"]}}, "roles.ops.categories.0", "'read', 'write' or 'admin'"),
        ({"ops": {"commands": ["deploy"]}}, "roles.ops.commands.0", "`/deploy` is not a command"),
        ({"ops": {"members": ["U012"]}}, "roles.ops.members.0", "`U012` is not a member"),
        ({"ops": {"members": ["irc:bob"]}}, "roles", "`irc:bob` in roles.ops.members"),
        ({"default": "guest"}, "roles", '`default = "guest"` names no role'),
        ({"ops": {"approve": True}}, "roles.ops.approve", "Extra inputs"),
    ],
)
def test_bad_roles_are_config_errors_naming_the_key(
    tmp_path: Path, roles: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**_base(tmp_path), "roles": roles})
    assert caught.value.key == key
    assert message in str(caught.value)


def _base(tmp_path: Path) -> dict[str, Any]:
    provider = {"kind": "openai_chat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    return {"default_provider": "p", "providers": {"p": provider}}


async def test_a_reload_is_audited_and_new_roles_apply_to_the_next_command(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from bot.app import App, build_registry
    from bot.config import load_config
    from bot.run import _agent_follows_reloads
    from tests.process import fake_llm_config

    path = tmp_path / "config.toml"
    path.write_text(fake_llm_config(fake_llm.base_url, tmp_path))
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    agent = await app.open_agent()
    try:
        _agent_follows_reloads(app, agent)
        chat = RecordingResponder()
        await agent.submit(inbound("/goal create x", key=SLACK, user_id="U9"), chat)
        extra = '[roles]\ndefault = "guest"\n[roles.guest]\ncommands = ["help"]\n'
        path.write_text(fake_llm_config(fake_llm.base_url, tmp_path, extra))
        app.reload()
        await agent.submit(inbound("/goal create y", key=SLACK, user_id="U9"), chat)
        assert chat.sent[0] == "Goal set: x"
        assert "not allowed for your role (guest)" in chat.sent[1]
        [row] = await _audit(agent, "config.reloaded")
        assert row.actor == "parley"
        assert row.detail["changed"] == ["roles"]
    finally:
        await app.close_agent(agent)
        await app.aclose()
