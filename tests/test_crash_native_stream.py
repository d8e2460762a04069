"""A `parley run` killed with SIGKILL in the middle of a native stream (docs/channels.md,
issue 27): after the restart the stream Slack still holds open is finished (stopped, and
edited to say the answer was interrupted) and the run is announced as interrupted, once;
it is not answered again. Telegram's drafts vanish by themselves: the restart only
announces the run. Real processes, the fake Slack / Telegram and the fake LLM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from core.agent.recovery import PREVIEW_RETRACTED
from tests.channels.test_stored_before_ack import (
    ALICE,
    TELEGRAM_TOKEN,
    free_port,
    parley_run,
    telegram_config,
)
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.process import child_env, slack_run_config
from tests.workerskit import INTERRUPTED

ANSWER = "pong " * 60
THREAD = "1700000000.000001"


def _answer(request: RecordedRequest) -> Reply:
    return Reply(text=ANSWER, chunk_size=10, chunk_delay=0.1)


async def test_slack_native_stream_killed_mid_answer_is_finished_after_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    port = free_port()
    async with FakeSlack() as slack:
        extra = f'mode = "http"\nhttp_port = {port}\nedit_interval_seconds = 0.1\n'
        config, env = slack_run_config(tmp_path, fake_llm.base_url, slack, extra)
        slack.http_target = (f"http://127.0.0.1:{port}/slack/events", "signing-secret")
        async with parley_run(config, env) as parley:
            dead = asyncio.Event()

            async def kill(params: dict[str, Any]) -> None:
                if not dead.is_set():
                    await parley.kill()
                    dead.set()

            slack.before_answer["chat.appendStream"] = kill
            await slack.dm("ping", thread_ts=THREAD)
            await asyncio.wait_for(dead.wait(), 30)
        del slack.before_answer["chat.appendStream"]
        (streamed,) = [m for m in slack.live_messages() if m.native]
        assert streamed.streaming  # left open by the kill
        assert streamed.text.startswith("pong")

        async with parley_run(config, env) as parley:
            notices = await slack.until(
                lambda: [m for m in slack.thread("D1", THREAD) if INTERRUPTED.search(m.text)],
                30,
                "the interrupted notice",
            )
            await slack.until(lambda: not streamed.streaming, 30, "the stream finished")
            await slack.until(lambda: streamed.text == PREVIEW_RETRACTED, 30, "the retraction")
            await asyncio.sleep(1.0)  # anything more would come now
            assert await parley.stop() == 0

    assert len(notices) == 1
    answers = [m for m in slack.thread("D1", THREAD) if m.text.startswith("pong")]
    assert answers == []  # not answered again
    asked = [r for r in fake_llm.requests if r.json["messages"][-1]["content"] == "ping"]
    assert len(asked) == 1


async def test_telegram_draft_killed_mid_answer_is_announced_after_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        config = telegram_config(tmp_path, fake_llm, telegram, "edit_interval_seconds = 0.1\n")
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
        async with parley_run(config, env) as parley:
            telegram.dm(ALICE, "ping")
            await telegram.wait_until(
                lambda: any("pong" in text for _, text in telegram.drafts.get(ALICE.id, [])),
                timeout=30,
                what="the draft",
            )
            await parley.kill()
        assert telegram.texts(ALICE.id) == []  # a draft is not a message: nothing to clean up

        async with parley_run(config, env) as parley:
            await telegram.wait_until(
                lambda: any(INTERRUPTED.search(t) for t in telegram.texts(ALICE.id)),
                timeout=30,
                what="the interrupted notice",
            )
            await asyncio.sleep(1.0)  # anything more would come now
            assert await parley.stop() == 0

    texts = telegram.texts(ALICE.id)
    assert len(texts) == 1, texts  # the notice, once; not answered again
    asked = [r for r in fake_llm.requests if r.json["messages"][-1]["content"] == "ping"]
    assert len(asked) == 1
