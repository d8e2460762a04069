"""Scoped long-term memory (docs/delegation-memory.md) through the real agent, the fake LLM over
HTTP and
the real store (SQLite; the scope tests on PostgreSQL too): who sees which memory, misses
logged and kept from the model, automatic recall, and `/memory`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.agent import Agent, RunReport
from core.chat import Inbound
from core.store import SqliteStore
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.store.conftest import postgres_schema

ALICE_DM = {"key": ("test", "D-alice", ""), "user_id": "alice", "is_dm": True}
BOB_DM = {"key": ("test", "D-bob", ""), "user_id": "bob", "user_name": "bob", "is_dm": True}
ALICE_IN_C1 = {"key": ("test", "C1", "t1"), "user_id": "alice", "is_dm": False}
BOB_IN_C1 = {"key": ("test", "C1", "t2"), "user_id": "bob", "user_name": "bob", "is_dm": False}
ALICE_IN_C2 = {"key": ("test", "C2", "t1"), "user_id": "alice", "is_dm": False}


@contextlib.asynccontextmanager
async def memory_agent(
    fake_llm: FakeLLM, tmp_path: Path, backend: str = "sqlite", **config: Any
) -> AsyncIterator[Agent]:
    if backend == "sqlite":
        async with running_agent(fake_llm, tmp_path, **config) as agent:
            yield agent
        return
    async with (
        postgres_schema() as url,
        running_agent(fake_llm, tmp_path, store={"path": None, "url": url}, **config) as agent,
    ):
        yield agent


async def call(
    agent: Agent, fake_llm: FakeLLM, tool: str, args: dict[str, Any], who: dict[str, Any]
) -> str:
    """`who` asks; the model calls `tool` once, then answers. The tool's result, as the
    model saw it."""
    fake_llm.script(Reply(tool_calls=[ToolCallSpec(tool, args)]), Reply(text="done"))
    report = await agent.run(inbound("please", **who))
    assert report.state == "completed", report
    return last_tool_result(fake_llm)


def last_tool_result(fake_llm: FakeLLM) -> str:
    messages = fake_llm.requests[-1].json["messages"]
    return str([m for m in messages if m["role"] == "tool"][-1]["content"])


async def remember(
    agent: Agent, fake_llm: FakeLLM, text: str, scope: str, who: dict[str, Any]
) -> str:
    return await call(agent, fake_llm, "remember", {"text": text, "scope": scope}, who)


async def recall(agent: Agent, fake_llm: FakeLLM, query: str, who: dict[str, Any]) -> str:
    return await call(agent, fake_llm, "recall", {"query": query}, who)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# --- scopes ------------------------------------------------------------------------------


async def test_a_dm_memory_stays_with_its_user_and_their_dm(
    fake_llm: FakeLLM, tmp_path: Path, backend: str
) -> None:
    async with memory_agent(fake_llm, tmp_path, backend) as agent:
        saved = await remember(agent, fake_llm, "my locker code is 4711", "user", ALICE_DM)
        assert "personal memory" in saved
        saved = await remember(agent, fake_llm, "the locker room is B2", "conversation", ALICE_DM)
        assert "4711" in await recall(agent, fake_llm, "locker code", ALICE_DM)
        for other in (BOB_DM, ALICE_IN_C1, BOB_IN_C1):
            assert await recall(agent, fake_llm, "locker code room", other) == (
                "No memories found."
            )


async def test_what_a_user_keeps_for_themself_in_a_channel_comes_back_only_in_their_dm(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        await remember(agent, fake_llm, "alice is vegetarian", "user", ALICE_IN_C1)
        assert "No memories" in await recall(agent, fake_llm, "vegetarian", ALICE_IN_C1)
        assert "No memories" in await recall(agent, fake_llm, "vegetarian", BOB_DM)
        assert "alice is vegetarian" in await recall(agent, fake_llm, "vegetarian", ALICE_DM)


async def test_a_channel_memory_is_shared_in_its_channel_only(
    fake_llm: FakeLLM, tmp_path: Path, backend: str
) -> None:
    async with memory_agent(fake_llm, tmp_path, backend) as agent:
        await remember(agent, fake_llm, "standup is at 9:30", "channel", ALICE_IN_C1)
        # Bob, in another thread of the same channel, sees it; nobody elsewhere does.
        assert "standup is at 9:30" in await recall(agent, fake_llm, "standup", BOB_IN_C1)
        assert "No memories" in await recall(agent, fake_llm, "standup", ALICE_IN_C2)
        assert "No memories" in await recall(agent, fake_llm, "standup", ALICE_DM)


async def test_a_team_memory_is_shared_everywhere_on_the_platform(
    fake_llm: FakeLLM, tmp_path: Path, backend: str
) -> None:
    async with memory_agent(fake_llm, tmp_path, backend) as agent:
        await remember(agent, fake_llm, "the VPN host is vpn.example.org", "team", ALICE_DM)
        for who in (BOB_DM, ALICE_IN_C2, BOB_IN_C1):
            assert "vpn.example.org" in await recall(agent, fake_llm, "vpn host", who)
        elsewhere = {**BOB_DM, "key": ("other", "D-bob", "")}
        assert "No memories" in await recall(agent, fake_llm, "vpn host", elsewhere)


async def test_a_conversation_memory_stays_in_its_conversation(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        await remember(agent, fake_llm, "we chose postgres", "conversation", ALICE_IN_C1)
        assert "we chose postgres" in await recall(
            agent, fake_llm, "postgres", BOB_IN_C1 | {"key": ALICE_IN_C1["key"]}
        )
        assert "No memories" in await recall(agent, fake_llm, "postgres", BOB_IN_C1)


async def test_the_same_note_twice_in_one_scope_is_kept_once(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        first = await remember(agent, fake_llm, "deploys freeze on Fridays", "team", ALICE_DM)
        again = await remember(agent, fake_llm, "deploys freeze on Fridays", "team", BOB_DM)
        other = await remember(agent, fake_llm, "deploys freeze on Fridays", "user", ALICE_DM)
        assert first.startswith("Remembered as #1 ")
        assert again == first
        assert other.startswith("Remembered as #2 ")


async def test_nobody_asking_means_no_user_scope(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        result = await remember(agent, fake_llm, "x", "user", {**ALICE_IN_C1, "user_id": ""})
        assert "no user scope here" in result


# --- misses ------------------------------------------------------------------------------


async def test_a_miss_is_logged_with_its_query_and_never_shown(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    long_query = "quarterly roadmap " + "x" * 1000
    async with memory_agent(fake_llm, tmp_path) as agent:
        fake_llm.script(
            Reply(tool_calls=[ToolCallSpec("recall", {"query": long_query})]),
            Reply(text="I don't know"),
        )
        report = await agent.run(inbound("what is the roadmap?", **ALICE_DM))
        await agent.store.flush()
        misses = await _misses(agent, report)
    assert len(misses) == 1
    miss = misses[0]
    assert miss["query"] == long_query[:512]
    assert (miss["strategy"], miss["error"]) == ("lexical", "no_results")
    assert miss["session_id"] == "test:D-alice:"
    assert isinstance(miss["ts"], float)
    sent = json.dumps([r.json for r in fake_llm.requests])
    assert "memory_miss" not in sent
    assert "no_results" not in sent
    assert last_tool_result(fake_llm) == "No memories found."
    assert report.text == "I don't know"
    assert "memory_miss" in (tmp_path / "events.jsonl").read_text()


async def test_a_match_below_min_score_is_a_miss(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path, memory={"min_score": 0.99}) as agent:
        await remember(agent, fake_llm, "the roadmap is due in May", "conversation", ALICE_DM)
        assert await recall(agent, fake_llm, "roadmap", ALICE_DM) == "No memories found."


async def test_a_failing_store_is_a_miss_with_its_error_and_the_run_goes_on(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        assert isinstance(agent.store, SqliteStore)
        await agent.store.write("DROP TABLE memories_fts")  # the index is gone
        fake_llm.script(
            Reply(tool_calls=[ToolCallSpec("recall", {"query": "roadmap"})]), Reply(text="ok")
        )
        report = await agent.run(inbound("roadmap?", **ALICE_DM))
        await agent.store.flush()
        misses = await _misses(agent, report)
        assert report.state == "completed"
        assert last_tool_result(fake_llm) == "Long-term memory is unavailable right now."
        assert [m["error"].split(":")[0] for m in misses] == ["OperationalError"]


async def _misses(agent: Agent, report: RunReport) -> list[dict[str, Any]]:
    events = await agent.store.events(report.run_id)
    return [data for _, name, _, data in events if name == "memory_miss"]


# --- automatic recall --------------------------------------------------------------------


async def test_auto_recall_quotes_the_askers_memories_before_their_message(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path, memory={"auto_recall": 2}) as agent:
        await remember(agent, fake_llm, "alice's cat is called Miso", "user", ALICE_DM)
        fake_llm.script(Reply(text="Miso"), Reply(text="no idea"), Reply(text="no idea"))
        await agent.run(inbound("what is my cat called?", **ALICE_DM))
        assert "alice's cat is called Miso" in _recalled(fake_llm)
        assert "Miso" not in _system(fake_llm)
        await agent.run(inbound("what is my cat called?", **ALICE_IN_C1))
        assert "Miso" not in _recalled(fake_llm) + _system(fake_llm)
        report = await agent.run(inbound("what is my cat called?", **BOB_DM))
        assert "Miso" not in _recalled(fake_llm) + _system(fake_llm)
        await agent.store.flush()
        assert [m["error"] for m in await _misses(agent, report)] == ["no_results"]


async def test_auto_recall_is_off_by_default(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        await remember(agent, fake_llm, "alice's cat is called Miso", "user", ALICE_DM)
        fake_llm.script(Reply(text="no idea"))
        await agent.run(inbound("what is my cat called?", **ALICE_DM))
        assert "Miso" not in _recalled(fake_llm) + _system(fake_llm)


def _system(fake_llm: FakeLLM) -> str:
    return str(fake_llm.requests[-1].json["messages"][0]["content"])


def _recalled(fake_llm: FakeLLM) -> str:
    """The block of recalled memories just before the user's message, or ""."""
    messages = fake_llm.requests[-1].json["messages"]
    before = messages[-2] if len(messages) > 1 else {}
    content = str(before.get("content", "")) if before.get("role") == "user" else ""
    return content if content.startswith("<memories") else ""


async def test_memory_off_offers_no_tools(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path, memory={"enabled": False}) as agent:
        fake_llm.script(Reply(text="hi"))
        await agent.run(inbound("hello", **ALICE_DM))
        tools = {t["function"]["name"] for t in fake_llm.requests[-1].json["tools"]}
        assert "get_run_journal" in tools
        assert not tools & {"remember", "recall"}


# --- /memory -----------------------------------------------------------------------------


async def command(agent: Agent, text: str, who: dict[str, Any]) -> str:
    chat = RecordingResponder()
    await agent.submit(inbound(text, **who), chat)
    return chat.sent[-1]


async def test_memory_lists_what_a_recall_could_return_here(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        await remember(agent, fake_llm, "alice's locker code is 4711", "user", ALICE_IN_C1)
        await remember(agent, fake_llm, "standup at 9:30", "channel", ALICE_IN_C1)
        await remember(agent, fake_llm, "we chose postgres " * 10, "conversation", ALICE_IN_C1)
        await remember(agent, fake_llm, "bob's note", "conversation", BOB_IN_C1)
        in_channel = await command(agent, "/memory", ALICE_IN_C1)
        lines = in_channel.splitlines()
        assert lines[0].startswith("Memories here")
        assert lines[1].startswith("#3 [conversation] we chose postgres")
        assert lines[1].endswith("…")
        assert len(lines[1]) < 100
        assert lines[2] == "#2 [channel] standup at 9:30"
        assert "4711" not in in_channel
        assert "bob's note" not in in_channel
        assert "personal memories are listed only in a direct message" in in_channel
        in_dm = await command(agent, "/memory", ALICE_DM)
        assert "#1 [user] alice's locker code is 4711" in in_dm
        assert "standup" not in in_dm
        assert await command(agent, "/memory", BOB_DM) == "No memories here."


async def test_forgetting_needs_a_scope_of_the_asker(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        await remember(agent, fake_llm, "alice's locker code is 4711", "user", ALICE_DM)
        await remember(agent, fake_llm, "dinner at eight", "conversation", ALICE_DM)
        await remember(agent, fake_llm, "lunch at noon", "conversation", ALICE_DM)
        await remember(agent, fake_llm, "standup at 9:30", "channel", ALICE_IN_C1)
        bob = await command(agent, "/memory forget 1", BOB_DM)
        assert bob == "There is no memory #1 that you can forget here."
        assert (await command(agent, "/memory forget 4", ALICE_IN_C2)).startswith("There is no")
        # Her own memory, even from a channel; the channel's, from inside it.
        assert await command(agent, "/memory forget #1", ALICE_IN_C1) == "Forgot #1."
        assert await command(agent, "/memory forget 4", BOB_IN_C1) == "Forgot #4."
        assert "No memories" in await recall(agent, fake_llm, "locker code", ALICE_DM)
        forgot = await command(agent, "/memory forget all", ALICE_DM)
        assert forgot == "Forgot 2 memories of this conversation."
        assert await command(agent, "/memory", ALICE_DM) == "No memories here."
        for bad in (
            "/memory forget",
            "/memory forget x",
            "/memory drop 1",
            "/memory forget " + "9" * 30,
        ):
            assert (await command(agent, bad, ALICE_DM)).startswith("Usage: /memory")


async def test_memory_is_in_help(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with memory_agent(fake_llm, tmp_path) as agent:
        assert "/memory [forget ID | forget all]" in await command(agent, "/help", ALICE_DM)


def test_inbound_asker_carries_who_and_where() -> None:
    message = Inbound("slack", "C1", "t", "U1", "al", "hi", is_dm=False)
    asker = message.asker("slack:C1:t", "r1")
    assert (asker.channel, asker.channel_id, asker.user_id, asker.is_dm) == (
        "slack",
        "C1",
        "U1",
        False,
    )
    assert (asker.conv, asker.run_id) == ("slack:C1:t", "r1")
