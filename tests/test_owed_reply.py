"""A run's answer is owed to its conversation until the platform takes it (docs/durability.md): a
`parley run` killed after the run ended but before its reply was accepted — the post
waiting out a 429, as a rate limiter makes it wait — posts it after the restart, once.

The hard way: a real process, the fake Slack and the fake LLM, SIGKILL. Without the owed
reply the run is `completed` in the store and the answer is in nobody's hands: it was
lost (seen in the 300-message Telegram test, whose posts wait in PTB's rate limiter)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.channels.test_stored_before_ack import parley_run, stored_runs
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack
from tests.process import slack_run_config

ANSWER = "pong: hold it"


def _pong(request: RecordedRequest) -> Reply:
    return Reply(text=ANSWER)


def _owed(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT state, reply FROM runs"))


async def test_an_answer_the_platform_had_not_taken_yet_is_posted_after_a_crash(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _pong
    db = tmp_path / "parley.db"

    def answering(params: dict[str, Any]) -> bool:
        return params.get("channel") == "D1"

    async with FakeSlack() as slack:
        config, env = slack_run_config(tmp_path, fake_llm.base_url, slack)
        for method in ("chat.postMessage", "chat.update"):  # the answer waits a minute
            slack.fail_next(method, 429, 60.0, times=5, where=answering)
        async with parley_run(config, env) as parley:
            await slack.connected()
            await slack.dm("hold it")
            await parley.until(lambda: stored_runs(db) == [("completed", "user")], "the run's end")
            assert _owed(db) == [("completed", ANSWER)]
            assert not list(slack.live_messages())  # still waiting out the 429
            await parley.kill()
        slack.fail_no_more()  # Slack takes posts again

        async with parley_run(config, env) as parley:
            await slack.connected(sessions=2)
            await slack.until(
                lambda: [m.text for m in slack.live_messages()] == [ANSWER], what="the answer"
            )
            assert await parley.stop() == 0
    assert [m.text for m in slack.live_messages()] == [ANSWER]
    assert _owed(db) == [("completed", None)]
    assert len(fake_llm.requests) == 1
