"""Telegram drafts end to end (docs/channels.md#telegram-drafts): private-chat answers
stream into `sendMessageDraft` and are then sent as messages; groups keep edits; where
drafts are refused the answer goes on by edits. Real python-telegram-bot against the fake
Telegram, the real agent against the fake LLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.events import CompactionProgress, Notice, TextDelta
from tests.channels.test_telegram import (
    ALICE,
    ENV,
    GROUP,
    EchoAgent,
    agent_on_telegram,
    button,
    junk_dir,
    prompt_in,
    script_rm,
    telegram,
    wait_text,
)
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.telegram import FakeTelegram


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=ENV["TELEGRAM_BOT_TOKEN"]) as server:
        yield server


ANSWER = "Both tools ran: the note says hello, and the folder holds it."
RUNNING = "⚙️ running `bash`…"


def _two_tools(tmp_path: Path) -> list[Reply]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "note.txt").write_text("hello")
    return [
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 0.3; cat note.txt"})]),
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 0.3; ls"})]),
        Reply(text=ANSWER, chunk_size=6, chunk_delay=0.02),
    ]


def drafts(fake: FakeTelegram, chat_id: int) -> list[str]:
    return [text for _, text in fake.drafts.get(chat_id, [])]


async def test_private_answer_with_two_tool_steps_streams_as_a_draft(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    fake_llm.script(*_two_tools(tmp_path))
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.dm(ALICE, "what does the note say?")
        await wait_text(fake, ALICE.id, ANSWER)
        await agent.wait_idle()

    shown = drafts(fake, ALICE.id)
    assert shown[0] == ""  # the "Thinking…" placeholder while the model works
    assert shown.count(RUNNING) == 2  # each tool step, as the one status line
    assert any(t.startswith("Both tools") and RUNNING not in t for t in shown)
    assert len({draft_id for draft_id, _ in fake.drafts[ALICE.id]}) == 1  # one draft
    assert fake.texts(ALICE.id) == [ANSWER]  # sent once, as a message, at the end
    assert not fake.calls_of("editMessageText")


async def test_without_drafts_the_answer_streams_by_edits_with_two_tool_steps(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    fake.drafts_enabled = False  # a Bot API before 9.3
    fake_llm.script(*_two_tools(tmp_path), Reply(text="Again, by edits."))
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.dm(ALICE, "what does the note say?")
        await wait_text(fake, ALICE.id, ANSWER)
        await agent.wait_idle()
        fake.dm(ALICE, "again")
        await wait_text(fake, ALICE.id, "Again, by edits.")
        await agent.wait_idle()

    assert len(fake.calls_of("sendMessageDraft")) == 1  # refused once: remembered
    assert fake.texts(ALICE.id) == [ANSWER, "Again, by edits."]
    assert fake.calls_of("editMessageText")


async def test_groups_keep_edits(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    fake_llm.script(Reply(text=ANSWER, chunk_size=6, chunk_delay=0.02))
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.group_message(GROUP, ALICE, "hi", mention=True)
        await wait_text(fake, GROUP, ANSWER)
        await agent.wait_idle()
    assert not fake.calls_of("sendMessageDraft")


async def test_a_draft_refused_mid_answer_goes_on_by_edits(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    long = " ".join(f"word{i}" for i in range(150)) + "."
    fake_llm.script(Reply(text=long, chunk_size=8, chunk_delay=0.02))
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.dm(ALICE, "talk")
        await fake.wait_for("sendMessageDraft", count=3)
        fake.fail_next("sendMessageDraft", 400, description="Bad Request: TEXTDRAFT_PEER_INVALID")
        await wait_text(fake, ALICE.id, long)
        await agent.wait_idle()

    assert fake.texts(ALICE.id) == [long]  # the edits took over: one message, in full
    assert fake.calls_of("editMessageText")


async def test_stop_mid_draft_is_answered_once(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    fake_llm.script(Reply(text="blah " * 400, chunk_size=5, chunk_delay=0.02))
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.dm(ALICE, "talk a lot")
        await fake.wait_until(lambda: any("blah" in t for t in drafts(fake, ALICE.id)))
        fake.command(ALICE, "stop")
        await wait_text(fake, ALICE.id, "Stopped.")
        await agent.wait_idle()
        await asyncio.sleep(0.3)  # a second answer would come now
    assert fake.texts(ALICE.id) == ["Stopped."]


async def test_an_approval_inside_a_drafted_answer(
    fake: FakeTelegram,
    fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    junk = junk_dir(tmp_path)
    script_rm(fake_llm, "Removed the junk.")
    async with agent_on_telegram(fake, fake_llm, tmp_path, drafts=True) as (agent, _):
        fake.dm(ALICE, "please clean up")
        await fake.wait_until(
            lambda: any("reply_markup" in m for m in fake.bot_messages(ALICE.id)), what="prompt"
        )
        prompt = prompt_in(fake, ALICE.id)
        await fake.wait_until(lambda: "🔐 waiting for approval" in drafts(fake, ALICE.id))
        fake.click(ALICE, ALICE.id, prompt["message_id"], button(prompt, "Approve"))
        await wait_text(fake, ALICE.id, "Removed the junk.")
        await agent.wait_idle()
    assert not junk.exists()
    assert fake.texts(ALICE.id)[-1] == "Removed the junk."


async def test_compaction_status_shows_in_the_draft_and_is_removed(
    fake: FakeTelegram,
) -> None:
    async with telegram(fake, EchoAgent(), drafts=True) as channel:
        fake.chats.setdefault(ALICE.id, {"id": ALICE.id, "type": "private"})
        stream = channel.responder(("telegram", str(ALICE.id), "")).stream()
        stream(TextDelta("Working on it."))
        stream(CompactionProgress("R1", 120_000))
        stream(CompactionProgress("R1", 120_000, 40_000))
        want = "Working on it.\n\n🗜 Compacting: 120k → 40k tokens"
        await fake.wait_until(lambda: want in drafts(fake, ALICE.id), what="compaction status")
        await stream.finish("Done.")
    assert fake.texts(ALICE.id) == ["Done."]  # the status is gone with the draft


async def test_the_wait_for_a_provider_shows_in_the_draft(fake: FakeTelegram) -> None:
    """Every provider down (docs/providers.md#failover): the failover's warning is the
    draft's status line while the run waits, and is gone with the draft."""
    async with telegram(fake, EchoAgent(), drafts=True) as channel:
        fake.chats.setdefault(ALICE.id, {"id": ALICE.id, "type": "private"})
        stream = channel.responder(("telegram", str(ALICE.id), "")).stream()
        stream(Notice("No LLM provider is available (tried claude); waiting 2s.", "warning"))
        want = "⏳ No LLM provider is available (tried claude); waiting 2s."
        await fake.wait_until(lambda: want in drafts(fake, ALICE.id), what="the wait's status")
        await stream.finish("Sorry: no LLM provider is available right now (tried claude).")
    assert fake.texts(ALICE.id) == ["Sorry: no LLM provider is available right now (tried claude)."]
