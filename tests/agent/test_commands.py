"""Commands (docs/commands.md): /provider persistence and fallback, /clear, /compact, /status,
/journal and the journal tools, /goal, /help."""

from __future__ import annotations

import json
from pathlib import Path

from core.context.manager import ContextManager
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec


async def test_provider_preference_survives_a_restart(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="from other"), Reply(text="still other"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/provider other"), chat)
        assert chat.sent == ["This channel now uses other."]
        await agent.submit(inbound("hi"), chat)
        await agent.wait_idle()
        assert fake_llm.requests[-1].json["model"] == "other-model"
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        # Another thread of the same channel uses the channel's preference too.
        await agent.submit(inbound("hi again", key=("test", "c1", "t9")), chat)
        await agent.wait_idle()
        assert fake_llm.requests[-1].json["model"] == "other-model"


async def test_a_channel_s_preference_is_read_from_the_store_once_not_every_turn(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda request: Reply(text="ok")
    async with running_agent(fake_llm, tmp_path) as agent:
        reads: list[str] = []
        connection = agent.store._read_conn  # SQLite's reader connection
        connection.set_trace_callback(lambda sql: "provider_prefs" in sql and reads.append(sql))
        chat = RecordingResponder()
        for text in ("one", "two", "three"):
            await agent.submit(inbound(text), chat)
            await agent.wait_idle()
        await agent.submit(inbound("four", key=("test", "c1", "t2")), chat)  # another thread
        await agent.wait_idle()
        assert chat.finals == ["ok"] * 4
        assert len(reads) == 1
        await agent.submit(inbound("/provider other"), chat)  # written through, not read
        await agent.submit(inbound("five"), chat)
        await agent.wait_idle()
        assert fake_llm.requests[-1].json["model"] == "other-model"
        assert len(reads) == 1


async def test_a_removed_provider_falls_back_to_the_default(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="default speaking"))
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("/provider other"), RecordingResponder())
    # "other" is gone from the configuration: the stored name is silently ignored.
    async with running_agent(fake_llm, tmp_path, providers={"other": None}) as agent:
        assert agent.factory.provider_names() == ["fake"]
        chat = RecordingResponder()
        await agent.submit(inbound("hello"), chat)
        await agent.wait_idle()
        assert chat.finals == ["default speaking"]
        assert fake_llm.requests[-1].json["model"] == "fake-model"
        await agent.submit(inbound("/status"), chat)
        assert chat.sent[-1].startswith("Provider: fake (fake-model)")


async def test_clear_empties_history_but_keeps_the_provider(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="noted"), Reply(text="fresh start"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/provider other"), chat)
        await agent.submit(inbound("remember 42"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/clear"), chat)
        assert "Cleared" in chat.sent[-1]
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("what number?"), chat)
        await agent.wait_idle()
        request = fake_llm.requests[-1].json
        assert request["model"] == "other-model"
        assert [m["content"] for m in request["messages"] if m["role"] != "system"] == [
            "what number?"
        ]


async def test_compact_reports_before_and_after_and_status_shows_it(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(*(Reply(text=f"answer {i} " + "lorem ipsum " * 80) for i in range(14)))
    fake_llm.responder = lambda request: Reply(text="Summary: we talked about lorem ipsum.")
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        for i in range(14):
            await agent.submit(inbound(f"question {i}"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/compact"), chat)
        reply = chat.sent[-1]
        assert reply.startswith("Compacted: ")
        before, after = (int(n.replace(",", "")) for n in reply[11:-8].split(" → "))
        assert after < before
        await agent.submit(inbound("/status"), chat)
        status = chat.sent[-1]
        assert f"Last compaction: {before}→{after} (manual)" in status
        assert "Context: " in status
        assert "Run: idle (last run: completed)" in status


async def test_journal_tools_digest_and_journal_command(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec(
                    "update_run_journal",
                    {"objective": "ship v2", "current_state": "tests green"},
                ),
                ToolCallSpec(
                    "append_run_journal_entry", {"field": "decisions", "entry": "use sqlite"}
                ),
            ]
        ),
        Reply(text="journal written"),
        Reply(text="next"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("plan it"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/journal"), chat)
        assert "objective: ship v2" in chat.sent[-1]
        assert "use sqlite" in chat.sent[-1]
    async with running_agent(fake_llm, tmp_path) as agent:  # the journal is persisted
        await agent.submit(inbound("go on"), RecordingResponder())
        await agent.wait_idle()
        system = fake_llm.requests[-1].json["messages"][0]["content"]
        assert "Run journal (digest): Objective: ship v2 | State: tests green" in system


async def test_goal_lifecycle_and_system_prompt(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="working on it"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/goal"), chat)
        assert "No goal set" in chat.sent[-1]
        await agent.submit(inbound('/goal create "migrate the CI"'), chat)
        assert chat.sent[-1] == "Goal set: migrate the CI"
        await agent.submit(inbound("start"), chat)
        await agent.wait_idle()
        assert "Active goal: migrate the CI" in fake_llm.requests[-1].json["messages"][0]["content"]
        await agent.submit(inbound("/goal create x --auto"), chat)
        assert "Autonomous goals are off" in chat.sent[-1]
        await agent.submit(inbound("/goal done"), chat)
        assert chat.sent[-1] == "Goal completed: migrate the CI"
        await agent.submit(inbound("/goal"), chat)
        assert "(completed)" in chat.sent[-1]
        await agent.submit(inbound("/goal clear"), chat)
        assert chat.sent[-1] == "Goal cleared."


async def test_help_lists_every_command_and_stop_when_idle(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/help"), chat)
        for name in ("help", "status", "stop", "clear", "compact", "resume", "provider", "goal"):
            assert f"/{name}" in chat.sent[-1]
        await agent.submit(inbound("/stop"), chat)
        assert chat.sent[-1] == "Nothing is running."
        assert fake_llm.requests == []


async def test_events_go_to_the_jsonl_log_and_the_store(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="hi"))
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("hello"), RecordingResponder())
        await agent.wait_idle()
        run = (await agent.store.runs())[0]
        stored = [name for _, name, _, _ in await agent.store.events(run.id)]
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    logged = [line["event"] for line in lines if line["run_id"] == run.id]
    assert stored == logged == ["agent_run.started", "agent.llm.call", "agent_run.completed"]
    assert all(line["conv"] == "test:c1:" for line in lines if line["run_id"] == run.id)


async def test_redelivered_event_is_answered_once_also_after_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="once"))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        assert await agent.submit(inbound("hi", event_id="ev1"), chat)
        assert not await agent.submit(inbound("hi", event_id="ev1"), chat)
        await agent.wait_idle()
    async with running_agent(fake_llm, tmp_path) as agent:
        assert not await agent.submit(inbound("hi", event_id="ev1"), chat)
    assert chat.finals == ["once"]


async def test_a_server_without_usage_gets_one_estimated_ledger(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="an answer of a few words", omit_usage=True))
    async with running_agent(fake_llm, tmp_path) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("hello there"), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/status"), chat)
        status = chat.sent[-1]
        runs = await agent.store.runs(limit=5)
        run = next(r for r in runs if r.state == "completed")
        events = await agent.store.events(run.id)
    line = next(x for x in status.splitlines() if x.startswith("Tokens used here"))
    assert line == f"Tokens used here: {run.input_tokens:,} in, {run.output_tokens:,} out"
    assert run.input_tokens > 0
    assert run.output_tokens > 0
    usage = [data for _at, name, _it, data in events if name == "agent.llm.usage"]
    assert usage == [
        {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens, "estimated": True}
    ]


async def test_status_shows_the_active_subgoal(fake_llm: FakeLLM, tmp_path: Path) -> None:
    def answer(request: RecordedRequest) -> Reply:
        if "current subgoal is" in json.dumps(request.json):
            return Reply(text="SUBGOAL: rename the config keys")
        return Reply(text="on it")

    fake_llm.responder = answer
    async with running_agent(fake_llm, tmp_path, context={"strategy": "subgoal"}) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("please rename the config keys"), chat)
        await agent.wait_idle()
        (lane,) = agent.lanes.values()
        assert lane.conversation is not None
        context = lane.conversation.guards.context
        assert isinstance(context, ContextManager)
        assert context.subgoals is not None
        await context.subgoals.settle()  # the extraction ran beside the turn
        await agent.submit(inbound("/status"), chat)
        assert "Subgoal: rename the config keys" in chat.sent[-1]
    async with running_agent(fake_llm, tmp_path) as agent:  # strategy "summary": no line
        await agent.submit(inbound("/status"), chat)
        assert "Subgoal:" not in chat.sent[-1]
