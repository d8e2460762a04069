"""A preview left by a crash (docs/durability.md, docs/channels.md): `parley run` is killed with
SIGKILL while an
answer streams into Telegram; after the restart the half-written message is edited to
say the answer continues below, and `/resume` posts the answer once, in a new message."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from core.agent.recovery import PREVIEW_RETRACTED
from tests.channels.test_stored_before_ack import ALICE, TELEGRAM_TOKEN, parley_run
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.telegram import FakeTelegram
from tests.process import child_env, telegram_run_config

SLOW = "The first half of a long answer arrives slowly, word by word. " * 40


def _previews_recorded(db: Path) -> bool:
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM events WHERE name = 'channel.preview.posted'"
            ).fetchone()
    except sqlite3.OperationalError:
        return False
    return bool(row and row[0])


async def test_a_preview_left_by_a_crash_is_retracted_and_resume_answers_below(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text=SLOW, chunk_size=8, chunk_delay=0.05))
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        # Edited previews (a draft is no message: tests/test_crash_native_stream.py).
        extra = "edit_interval_seconds = 0.2\ndrafts = false"
        config = telegram_run_config(tmp_path, fake_llm.base_url, telegram.url, ALICE.id, extra)
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
        async with parley_run(config, env) as first:
            telegram.dm(ALICE, "tell me everything")
            await first.until(
                lambda: telegram.texts(ALICE.id) and _previews_recorded(tmp_path / "parley.db"),
                "a streamed preview",
            )
            await first.kill()
        preview = telegram.texts(ALICE.id)[0]
        assert preview != SLOW.strip()  # cut off mid-answer
        fake_llm.script(Reply(text="The whole answer."))
        async with parley_run(config, env) as second:
            await second.until(
                lambda: PREVIEW_RETRACTED in telegram.texts(ALICE.id), "the retracted preview"
            )
            telegram.dm(ALICE, "/resume")
            await second.until(
                lambda: "The whole answer." in telegram.texts(ALICE.id), "the resumed answer"
            )
            await asyncio.sleep(0)
    texts = telegram.texts(ALICE.id)
    assert texts[0] == PREVIEW_RETRACTED
    assert texts.count("The whole answer.") == 1
    assert not any(t.startswith("The first half") for t in texts)
