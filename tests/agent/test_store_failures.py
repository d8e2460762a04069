"""Store write failures (docs/durability.md): one bad statement loses only itself, never the rest of
its group commit (other conversations' checkpoints and events); its writer hears a
StoreError, `flush` raises, and a run whose writes failed says so. The failures come from
the database itself: a trigger that refuses some rows."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from core.errors import StoreError
from core.store import SqliteStore
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply

pytestmark = pytest.mark.store_failures_expected

REFUSE_BAD = """
CREATE TRIGGER refuse_bad BEFORE INSERT ON {table}
WHEN NEW.{column} LIKE '%bad%'
BEGIN SELECT RAISE(ABORT, 'the disk refuses this row'); END;
"""


def refuse(db: Path, table: str, column: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.executescript(REFUSE_BAD.format(table=table, column=column))


async def test_a_bad_statement_fails_alone_and_its_writer_hears_it(tmp_path: Path) -> None:
    db = tmp_path / "parley.db"
    store = await SqliteStore.open(db)
    refuse(db, "journals", "conv")
    store.save_journal("good-1", {"a": 1})
    bad = asyncio.ensure_future(store.write(
        "INSERT INTO journals (conv, body, updated_at) VALUES ('bad', '{}', 0)"
    ))  # fmt: skip
    store.save_journal("good-2", {"b": 2})
    with pytest.raises(StoreError, match="refuses"):
        await bad
    await store.flush()  # the waiter was told; nothing else failed
    assert await store.journal("good-1") == {"a": 1}
    assert await store.journal("good-2") == {"b": 2}
    await store.aclose()


async def test_flush_raises_for_a_failed_write_soon_once(tmp_path: Path) -> None:
    db = tmp_path / "parley.db"
    store = await SqliteStore.open(db)
    refuse(db, "journals", "conv")
    store.save_journal("bad", {"x": 1})
    store.save_journal("fine", {"y": 2})
    with pytest.raises(StoreError, match="refuses"):
        await store.flush()
    await store.flush()  # reported once
    assert await store.journal("fine") == {"y": 2}
    assert await store.journal("bad") is None
    await store.aclose()


async def test_a_run_whose_writes_fail_says_so_and_others_are_untouched(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda _r: Reply(text="an answer", chunk_delay=0.01)
    async with running_agent(fake_llm, tmp_path) as agent:
        refuse(tmp_path / "parley.db", "messages", "conv")
        good, bad = RecordingResponder(), RecordingResponder()
        await agent.submit(inbound("hi", key=("test", "good", "")), good)
        await agent.submit(inbound("hi", key=("test", "bad", "")), bad)
        await agent.wait_idle()
        assert good.finals == ["an answer"]
        assert bad.finals[0] is not None
        assert "could not save" in bad.finals[0]
        assert [m.content for m in await agent.store.load_messages("test:good:")][-1] == (
            "an answer"
        )
        runs = {r.conv: r for r in await agent.store.runs(limit=10)}
        assert runs["test:good:"].state == "completed"
        assert runs["test:bad:"].state == "failed"
