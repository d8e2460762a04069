"""SQLite's writer commits a step's rows on the event loop, but never waits there: a write
lock held elsewhere sends the batch to a worker thread, and the log's checkpoint (with its
fsync) runs there too."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from core.store import open_store
from core.store.sqlite_db import CHECKPOINT_STATEMENTS


async def test_a_batch_waits_for_a_lock_held_elsewhere_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "parley.db"
    async with await open_store(path) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        write = asyncio.create_task(store.mark_seen("slack", "E1"))
        ticks = 0
        while ticks < 20:  # the loop keeps turning while the write waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert not write.done()
        other.execute("COMMIT")
        other.close()
        await asyncio.wait_for(write, 10)
        assert await store.seen("slack", "E1")
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT count(*) FROM seen_events").fetchone() == (1,)


async def test_the_log_is_checkpointed_into_the_database_file(tmp_path: Path) -> None:
    path = tmp_path / "parley.db"
    async with await open_store(path) as store:
        await store.flush()
        before = path.stat().st_size
        for i in range(CHECKPOINT_STATEMENTS + 10):
            store.mark_seen_soon("slack", f"event-{i:05d}-{'x' * 80}")
        await store.flush()
        # the rows reached the database file itself, not just the write-ahead log
        assert path.stat().st_size > before + 100 * CHECKPOINT_STATEMENTS // 2
        assert await store.seen("slack", f"event-{CHECKPOINT_STATEMENTS:05d}-{'x' * 80}")
        for i in range(3):  # and the writer goes on committing after it
            store.mark_seen_soon("slack", f"after-{i}")
            await store.flush()
        assert await store.seen("slack", "after-2")
