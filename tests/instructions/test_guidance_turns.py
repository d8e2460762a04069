"""Instruction files and skills with the real agent and the fake LLM: they join the system
message; an edit reaches the next turn — by the file watch, no SIGHUP needed — and never
the turn that is running; the system message stays byte-for-byte the same while nothing
changes; a change shows in the run's prompt hash; approvers choose a chat's instructions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import App, build_registry
from bot.config import load_config
from core.agent import Agent
from tests.agentkit import RecordingResponder, inbound
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec
from tests.process import fake_llm_config

SKILL = "---\nname: {name}\ndescription: {description}\n---\nStep one: {body}\n"
SLACK = ("slack", "C1", "")


def system(request: RecordedRequest) -> str:
    content = request.json["messages"][0]["content"]
    assert isinstance(content, str)
    return content


def tools(request: RecordedRequest) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools", [])]


def add_skill(root: Path, name: str, text: str) -> None:
    (root / "skills" / name).mkdir(parents=True, exist_ok=True)
    (root / "skills" / name / "SKILL.md").write_text(text)


@pytest.fixture
async def app(fake_llm: FakeLLM, tmp_path: Path) -> AsyncIterator[App]:
    """config.toml in tmp_path: AGENTS.md, skills/ and instructions/ are beside it."""
    extra = """
        [channels.slack]
        approvers = ["boss"]
        instructions = "slack.md"
        """
    path = tmp_path / "config.toml"
    path.write_text(fake_llm_config(fake_llm.base_url, tmp_path, extra))
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    yield app
    await app.aclose()


@pytest.fixture
async def agent(app: App) -> AsyncIterator[Agent]:
    agent = await app.open_agent()
    yield agent
    await app.close_agent(agent)


async def prompt_hash(agent: Agent, run_id: str) -> str:
    checkpoint = await agent.store.last_checkpoint(run_id)
    assert checkpoint is not None
    return checkpoint.prompt_hash


async def test_an_agents_md_edit_reaches_the_next_turn_and_never_the_running_one(
    fake_llm: FakeLLM, tmp_path: Path, agent: Agent
) -> None:
    agents_md = tmp_path / "AGENTS.md"
    agents_md.write_text("Rule one: answer in French.\n")
    calls = 0

    def model(request: RecordedRequest) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:  # the operator edits the file while the first turn is running
            agents_md.write_text("Rule two: answer in German.\n")
            return Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})])
        return Reply(text=f"answer {calls}")

    fake_llm.responder = model
    first = await agent.run(inbound("first"))
    second = await agent.run(inbound("second"))
    third = await agent.run(inbound("third"))
    one, two, three, four = (system(r) for r in fake_llm.requests)
    assert "Rule one: answer in French." in one
    assert two == one  # the same turn, after the edit: not a byte changed
    assert "Rule two: answer in German." in three
    assert "Rule one" not in three
    assert four == three  # nothing changed since: the same bytes (prompt caching)
    assert "Team instructions (AGENTS.md)" in three
    hashes = [await prompt_hash(agent, r.run_id) for r in (first, second, third)]
    assert hashes[0] != hashes[1] == hashes[2]


async def test_skills_are_listed_by_name_and_description_and_loaded_by_the_tool(
    fake_llm: FakeLLM, tmp_path: Path, app: App, agent: Agent
) -> None:
    add_skill(tmp_path, "deploy", SKILL.format(name="deploy", description="Ship it.", body="x"))
    add_skill(tmp_path, "broken", "---\nname: broken\ndescription: [oops\n---\n")
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("load_skill", {"name": "deploy"})]),
        Reply(text="loaded"),
    )
    report = await agent.run(inbound("deploy the api"))
    assert report.text == "loaded"
    first, second = fake_llm.requests
    assert "- deploy: Ship it." in system(first)
    assert "Step one" not in system(first)  # only names and descriptions
    assert "broken" not in system(first)
    assert "load_skill" in tools(first)
    result = next(m for m in second.json["messages"] if m["role"] == "tool")
    assert "Step one: x" in result["content"]
    assert any("skills/broken/SKILL.md skipped" in w for w in app.guidance.warnings)


async def test_a_skill_added_between_turns_is_offered_from_the_next_turn(
    fake_llm: FakeLLM, tmp_path: Path, agent: Agent
) -> None:
    fake_llm.script(Reply(text="a"), Reply(text="b"))
    await agent.run(inbound("first"))
    add_skill(tmp_path, "triage", SKILL.format(name="triage", description="Sort bugs.", body="y"))
    await agent.run(inbound("second"))
    first, second = fake_llm.requests
    assert "load_skill" not in tools(first)
    assert "Skills:" not in system(first)
    assert "load_skill" in tools(second)
    assert "- triage: Sort bugs." in system(second)


async def test_a_channels_file_and_a_chat_choice_join_only_there(
    fake_llm: FakeLLM, tmp_path: Path, agent: Agent
) -> None:
    (tmp_path / "slack.md").write_text("Slack: keep answers short.\n")
    (tmp_path / "instructions").mkdir()
    (tmp_path / "instructions" / "oncall.md").write_text("On call: page the SRE first.\n")
    chat = RecordingResponder()
    await agent.submit(inbound("/instructions set oncall", key=SLACK, user_id="intern"), chat)
    await agent.submit(inbound("/instructions set oncall", key=SLACK, user_id="boss"), chat)
    assert chat.sent[0] == (  # only approvers (the admin role) choose, as before roles
        "`/instructions set oncall` is not allowed for your role (member); it needs the role admin."
    )
    assert chat.sent[1] == "This chat now follows oncall.md (from the next turn on)."
    fake_llm.script(Reply(text="a"), Reply(text="b"), Reply(text="c"))
    await agent.run(inbound("in slack", key=SLACK))
    await agent.run(inbound("in slack, another thread", key=("slack", "C1", "17.1")))
    await agent.run(inbound("elsewhere"))
    in_slack, in_thread, elsewhere = (system(r) for r in fake_llm.requests)
    for text in (in_slack, in_thread):  # the choice is the chat's, every thread of it
        assert "Slack: keep answers short." in text
        assert "On call: page the SRE first." in text
    assert "Slack:" not in elsewhere
    assert "On call" not in elsewhere
    await agent.submit(inbound("/instructions", key=SLACK, user_id="anyone"), chat)
    assert "Chosen for this chat:" in chat.sent[-1]
    assert "oncall.md" in chat.sent[-1]


async def test_a_broken_tools_yaml_found_by_the_watch_keeps_the_running_configuration(
    fake_llm: FakeLLM, tmp_path: Path, app: App, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch reloads config.toml too; a file that does not validate is logged once
    and the running configuration (and its tools) stays."""
    config = tmp_path / "config.toml"
    fake_llm.script(Reply(text="a"), Reply(text="b"))
    await agent.run(inbound("first"))
    config.write_text(config.read_text() + "\n[agent]\nmax_iterations = 0\n")
    await agent.run(inbound("second"))
    assert app.generation == 0
    assert "the running configuration stays" in caplog.text
    assert tools(fake_llm.requests[0]) == tools(fake_llm.requests[1])


async def test_sighup_reads_the_guidance_again_too(
    fake_llm: FakeLLM, tmp_path: Path, app: App, agent: Agent
) -> None:
    fake_llm.script(Reply(text="a"), Reply(text="b"))
    await agent.run(inbound("first"))
    (tmp_path / "AGENTS.md").write_text("Rule three.\n")
    add_skill(tmp_path, "triage", SKILL.format(name="triage", description="Sort.", body="z"))
    line = app.reload()  # what SIGHUP calls
    assert line == "configuration reloaded (generation 1); instructions: AGENTS.md; skills: triage"
    await agent.run(inbound("second"))
    assert "Rule three." in system(fake_llm.requests[1])
    assert app.generation == 1  # the watch found nothing more to read
