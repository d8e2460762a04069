"""Tool search: past `[tools] search_threshold` team (tools.yaml) and MCP tools, a request
carries the built-ins and `find_tools`; the tools it finds are added for the rest of the
run, in the order found (the set only grows), and a later turn starts with the tools its
history used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec

SERVICES = ["billing", "search", "payments", "auth", "gateway", "mailer", "reports"]
VERBS = ["deploy", "restart", "logs", "status", "scale"]


def team_tools(tmp_path: Path, count: int) -> Path:
    """A tools.yaml with `count` team tools (`deploy_billing`, `logs_search`, …)."""
    tools = []
    for i in range(count):
        verb, service = VERBS[i % len(VERBS)], SERVICES[i // len(VERBS) % len(SERVICES)]
        tools.append(
            {
                "name": f"{verb}_{service}_{i}",
                "description": f"{verb.title()} the {service} service. Prints what it did.",
                "category": "read",
                "cmd": "echo",
                "args": [f"{verb} {service}", "{{note}}"],
                "parameters": {"note": {"type": "string", "description": "Why."}},
            }
        )
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": tools}))
    return path


def offered(request: Any) -> list[str]:
    return [tool["function"]["name"] for tool in request.json.get("tools", [])]


BUILT_INS = ["bash", "read_file", "write_file", "list_directory", "ask_human"]


async def test_below_the_threshold_every_tool_is_offered(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="hi"))
    tools = {"tools_file": str(team_tools(tmp_path, 30))}
    async with running_agent(fake_llm, tmp_path, tools=tools) as agent:
        await agent.submit(inbound("hello"), RecordingResponder())
        await agent.wait_idle()
    names = offered(fake_llm.requests[0])
    assert "deploy_billing_0" in names
    assert "scale_mailer_29" in names
    assert "find_tools" not in names


async def test_above_the_threshold_tools_are_found_and_only_added(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("find_tools", {"query": "restart payments", "limit": 2})]),
        Reply(tool_calls=[ToolCallSpec("find_tools", {"query": "mailer logs", "limit": 1})]),
        # Called by name without being found: it runs (through the same policy).
        Reply(tool_calls=[ToolCallSpec("status_auth_18", {"note": "x"}, "unfound")]),
        Reply(text="done"),
        Reply(text="second turn"),
    )
    chat = RecordingResponder()
    tools = {"tools_file": str(team_tools(tmp_path, 35))}
    async with running_agent(fake_llm, tmp_path, tools=tools) as agent:
        await agent.submit(inbound("restart payments"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("and now?"), chat)
        await agent.wait_idle()
    first, second, third, fourth, next_turn = (offered(r) for r in fake_llm.requests)
    assert first[-1] == "find_tools"
    assert set(BUILT_INS) <= set(first)
    assert not any(name.endswith(("_0", "_11", "_34")) for name in first)  # no team tool yet
    found = second[len(first) :]
    assert second[: len(first)] == first  # what was offered stays, in place
    assert found == ["restart_payments_11", "restart_billing_1"]  # best first, then ties
    assert third[: len(second)] == second  # the set only grows
    assert third[len(second) :] == ["logs_mailer_27"]
    assert fourth[: len(third)] == third
    assert fourth[len(third) :] == ["status_auth_18"]  # called: offered from then on
    results = {m["tool_call_id"]: m["content"] for m in fake_llm.requests[3].json["messages"]
               if m["role"] == "tool"}  # fmt: skip
    assert "status auth x" in results["unfound"]
    # The next turn starts with what the history used (the same tools, the same order).
    assert next_turn == fourth


async def test_find_tools_says_what_it_found(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("find_tools", {"query": "scale gateway"}, "f1")]),
        Reply(tool_calls=[ToolCallSpec("find_tools", {"query": "kubernetes"}, "f2")]),
        Reply(text="ok"),
    )
    tools = {"tools_file": str(team_tools(tmp_path, 35))}
    async with running_agent(fake_llm, tmp_path, tools=tools) as agent:
        await agent.submit(inbound("scale"), RecordingResponder())
        await agent.wait_idle()
    results = {m["tool_call_id"]: m["content"] for m in fake_llm.requests[-1].json["messages"]
               if m["role"] == "tool"}  # fmt: skip
    assert results["f1"].startswith("Found ")
    assert "- scale_gateway_24: Scale the gateway service." in results["f1"]
    assert results["f2"].startswith("No tool matches `kubernetes`")


async def test_tools_the_role_refuses_are_never_found_or_offered(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """docs/governance.md#roles: `find_tools` does not find what the run's role denies,
    and a denied tool called by name is refused and not offered from then on."""
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("find_tools", {"query": "restart payments"}, "f1")]),
        Reply(tool_calls=[ToolCallSpec("restart_payments_11", {"note": "x"}, "byname")]),
        Reply(text="done"),
    )
    tools = {"tools_file": str(team_tools(tmp_path, 35))}
    roles = {"default": "ops", "ops": {"deny_tools": ["restart_*", "bash"]}}
    async with running_agent(fake_llm, tmp_path, tools=tools, roles=roles) as agent:
        await agent.submit(inbound("restart payments"), RecordingResponder())
        await agent.wait_idle()
    first, second, third = (offered(r) for r in fake_llm.requests)
    assert "find_tools" in first
    assert "bash" not in first
    results = {m["tool_call_id"]: m["content"] for m in fake_llm.requests[2].json["messages"]
               if m["role"] == "tool"}  # fmt: skip
    assert "restart_" not in results["f1"]  # other tools match the words; these are not found
    assert "payments" in results["f1"]
    assert "`restart_payments_11` (read) is not allowed for your role (ops)" in results["byname"]
    assert not any(name.startswith("restart_") for name in second + third)
