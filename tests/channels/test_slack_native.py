"""Slack's AI-app surfaces end to end (docs/channels.md#slack-native-streaming): native
streaming with tool steps as task chunks, its fallback to edits, the thread status and
assistant threads. Real slack-bolt / slack_sdk against the fake Slack, the real agent
against the fake LLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack_api import slack_call
from channels.slack_blocks import APPROVE_ACTION
from channels.slack_status import APPROVAL, THINKING, ThreadStatus, running
from core.chat import ConversationKey, Inbound, Responder
from core.events import CompactionProgress
from tests.agentkit import running_agent
from tests.channels.test_slack import config, slack_channel
from tests.fakes.clock import ManualClock
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.fakes.slack import TEAM_ID, FakeSlack, Posted

READ = "sleep 0.4; cat note.txt"
LIST = "sleep 0.4; ls"
ANSWER = "Both **tools** ran: the note says hello, and the folder holds it."


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as slack:
        yield slack


def _two_tools(tmp_path: Path) -> list[Reply]:
    workspace = tmp_path / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "note.txt").write_text("hello")
    # Each step takes a moment, so its status is up long enough to be sent (a status that
    # was replaced before it went out is not sent at all).
    return [
        Reply(tool_calls=[ToolCallSpec("bash", {"command": READ}, id="call_read")]),
        Reply(tool_calls=[ToolCallSpec("bash", {"command": LIST}, id="call_list")]),
        Reply(text=ANSWER, chunk_size=6, chunk_delay=0.02),
    ]


def _answers(fake: FakeSlack, channel: str, thread_ts: str) -> list[Posted]:
    return [m for m in fake.thread(channel, thread_ts) if not m.blocks]


async def _settled(fake: FakeSlack, channel: str, thread_ts: str, text: str) -> Posted:
    """The one answer in the thread once it reads `text` and its stream is over."""

    def done() -> Posted | None:
        answers = _answers(fake, channel, thread_ts)
        last = answers[-1] if answers else None
        if last is not None and not last.streaming and last.text.strip() == text:
            return last
        return None

    posted: Posted = await fake.until(done, what=f"answer {text[:30]!r}")
    return posted


def _statuses(fake: FakeSlack, channel: str, thread_ts: str) -> list[str]:
    return [s for c, t, s in fake.statuses if (c, t) == (channel, thread_ts)]


async def test_native_stream_in_a_channel_thread_with_two_tool_steps(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(*_two_tools(tmp_path))
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        root = await fake.mention("what does the note say?")
        posted = await _settled(fake, "C1", root.ts, ANSWER)
        await fake.until(lambda: fake.status_of("C1", root.ts) == "", what="status cleared")

    (start,) = fake.calls_of("chat.startStream")
    assert start.params["recipient_user_id"] == "U1"  # a channel stream names its reader
    assert start.params["recipient_team_id"] == TEAM_ID
    assert start.params["task_display_mode"] == "timeline"
    assert posted.native
    assert len(_answers(fake, "C1", root.ts)) == 1  # one message, no edits
    assert not fake.calls_of("chat.update")
    assert not fake.calls_of("chat.postMessage")
    steps = [(t["id"], t["status"]) for t in posted.tasks]
    assert steps == [
        ("call_read", "in_progress"),
        ("call_read", "complete"),
        ("call_list", "in_progress"),
        ("call_list", "complete"),
    ]
    assert "hello" in posted.tasks[1]["output"]  # the step's outcome
    assert posted.text == ANSWER  # Markdown: Slack renders it
    shown = _statuses(fake, "C1", root.ts)
    assert THINKING in shown
    assert shown.count(running("bash")) == 2
    assert shown[-1] == ""  # cleared on the answer


async def test_edits_when_the_workspace_cannot_stream_with_two_tool_steps(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake.streaming = False  # chat.startStream answers missing_scope
    fake_llm.script(*_two_tools(tmp_path), Reply(text="Again."))
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        root = await fake.mention("what does the note say?")
        posted = await fake.until(
            lambda: next((m for m in _answers(fake, "C1", root.ts) if "Both" in m.text), None)
        )
        await fake.until(lambda: posted.text == ANSWER.replace("**", "*"), what="final edit")
        second = await fake.mention("once more")
        await fake.until(lambda: [m for m in _answers(fake, "C1", second.ts) if m.text == "Again."])
        await fake.until(lambda: fake.status_of("C1", root.ts) == "", what="status cleared")

    assert len(fake.calls_of("chat.startStream")) == 1  # remembered: not tried again
    assert not posted.native
    assert len(_answers(fake, "C1", root.ts)) == 1
    shown = _statuses(fake, "C1", root.ts)
    assert shown.count(running("bash")) == 2
    assert shown[-1] == ""


async def test_a_stream_that_expires_mid_answer_goes_on_by_edits(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    long = " ".join(f"word{i}" for i in range(120)) + "."
    fake_llm.script(Reply(text=long, chunk_size=8, chunk_delay=0.02))
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        opened = await fake.dm("talk", thread_ts="1700000000.000001")
        thread = opened.payload["event"]["thread_ts"]
        await fake.wait_for("chat.appendStream")
        fake.expire_streams()  # Slack ended the stream as it stood
        posted = await _settled(fake, "D1", thread, long)

    assert posted.native  # the same message, edited on
    assert len(_answers(fake, "D1", thread)) == 1  # nothing posted twice
    assert fake.calls_of("chat.update")
    refused = fake.calls_of("chat.appendStream")
    assert len(refused) >= 2


async def test_stop_refused_with_user_not_found_ends_the_answer_by_edits(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake.stop_error = "user_not_found"  # Slack Connect: the reader is in another org
    fake_llm.script(Reply(text=ANSWER, chunk_size=6, chunk_delay=0.02))
    cfg = config(fake, allow_channels=["C1"])
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        root = await fake.mention("hi")
        await fake.wait_for("chat.stopStream")

        def final() -> list[Posted]:
            return [m for m in _answers(fake, "C1", root.ts) if m.text == ANSWER.replace("**", "*")]

        await fake.until(final, what="the answer, edited in full")

    # The stream could not be stopped, so its message could not be edited: it was removed
    # and the answer posted whole. One answer shows; none is lost.
    (answer,) = _answers(fake, "C1", root.ts)
    assert not answer.native


async def test_an_approval_inside_a_native_stream(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    junk = tmp_path / "workspace" / "junk"
    junk.mkdir(parents=True)
    fake_llm.script(
        Reply(
            text="Cleaning up. ",
            tool_calls=[ToolCallSpec("bash", {"command": "rm -rf ./junk"}, id="call_rm")],
        ),
        Reply(text="Removed it."),
    )
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent):
        opened = await fake.dm("clean up", thread_ts="1700000000.000001")
        thread = opened.payload["event"]["thread_ts"]
        await fake.wait_for("chat.postMessage", where=lambda c: bool(c.params.get("blocks")))
        prompt = next(m for m in fake.live_messages() if m.blocks)
        assert prompt.thread_ts == thread
        await fake.until(lambda: fake.status_of("D1", thread) == APPROVAL, what="approval status")
        streamed = next(m for m in _answers(fake, "D1", thread))
        assert streamed.streaming  # the stream stays open while the approver decides
        await fake.click("D1", prompt.ts, APPROVE_ACTION, user="U2")

        def answered() -> Posted | None:
            done = [m for m in _answers(fake, "D1", thread) if not m.streaming]
            return done[-1] if done and done[-1].text.endswith("Removed it.") else None

        posted = await fake.until(answered, what="the answer")

    assert not junk.exists()
    assert posted is streamed
    assert [t["status"] for t in posted.tasks] == ["in_progress", "complete"]
    assert _statuses(fake, "D1", thread)[-1] == ""


async def test_status_is_refreshed_every_90_seconds_until_cleared(fake: FakeSlack) -> None:
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.url)
    clock = ManualClock()

    async def send(text: str) -> Any:
        return await slack_call(
            client.assistant_threads_setStatus(channel_id="C1", thread_ts="1.2", status=text)
        )

    status = ThreadStatus(send, clock)
    status.show(THINKING)
    await status.synced()
    assert _statuses(fake, "C1", "1.2") == [THINKING]
    for sent in (2, 3):
        await _until(lambda: clock.wake_times() == [clock.now + 90.0])
        clock.advance(89.0)
        await asyncio.sleep(0.05)
        assert len(_statuses(fake, "C1", "1.2")) == sent - 1  # not yet
        clock.advance(1.0)
        await _until(lambda n=sent: len(_statuses(fake, "C1", "1.2")) == n)
    await status.clear()
    assert _statuses(fake, "C1", "1.2") == [THINKING, THINKING, THINKING, ""]
    clock.advance(500.0)
    await asyncio.sleep(0.05)
    assert len(_statuses(fake, "C1", "1.2")) == 4  # a cleared status is not sent again


class Idle:
    """A stand-in agent: the test drives the responder itself."""

    async def submit(self, inbound: Inbound, responder: Responder) -> bool:
        return True

    async def cancel_running(self, key: ConversationKey) -> bool:
        return False

    async def answer_approval(self, *args: Any, **kwargs: Any) -> None:
        return None


async def test_compaction_status_is_shown_and_cleared(fake: FakeSlack) -> None:
    channel_cfg = config(fake, allow_channels=["C1"])
    async with slack_channel(fake, Idle(), channel_cfg) as slack:
        stream = slack.responder(("slack", "C1", "1.2")).stream()
        stream(CompactionProgress("R1", 120_000))
        await fake.until(lambda: fake.status_of("C1", "1.2") == "Compacting: 120k tokens…")
        stream(CompactionProgress("R1", 120_000, 40_000))
        want = "Compacting: 120k → 40k tokens"
        await fake.until(lambda: fake.status_of("C1", "1.2") == want)
        await stream.finish("Done.")
    assert fake.status_of("C1", "1.2") == ""


async def test_assistant_thread_gets_prompts_a_title_and_the_viewed_channel(
    fake: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    prompts = [{"title": "Summarise", "message": "Summarise this channel"}]
    fake_llm.script(Reply(text="Here it is."))
    cfg = config(fake, suggested_prompts=prompts)
    thread = "1700000000.000001"
    started: dict[str, Any] = {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": "U1",
            "context": {"channel_id": "C7", "team_id": TEAM_ID},
            "channel_id": "D1",
            "thread_ts": thread,
        },
        "event_ts": "1700000000.000002",
    }
    async with running_agent(fake_llm, tmp_path) as agent, slack_channel(fake, agent, cfg):
        await fake.send_event(started)
        await fake.until(lambda: fake.prompts.get(("D1", thread)), what="suggested prompts")
        changed = started | {"type": "assistant_thread_context_changed"}
        changed["assistant_thread"] = started["assistant_thread"] | {
            "context": {"channel_id": "C8", "team_id": TEAM_ID}
        }
        await fake.send_event(changed)
        await fake.dm("Summarise this channel please", thread_ts=thread)
        await _settled(fake, "D1", thread, "Here it is.")
        await fake.until(lambda: fake.titles.get(("D1", thread)), what="title")

    assert fake.prompts[("D1", thread)] == prompts
    assert fake.titles[("D1", thread)] == "Summarise this channel please"
    asked = fake_llm.requests[0].json["messages"][-1]["content"]
    assert asked == "(I am looking at <#C8>.)\nSummarise this channel please"


async def _until(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
