"""A `parley run` killed right after its answer's first preview reached the chat
(docs/durability.md, docs/scale-out.md, issues 15 and 23): the run must be gone on with from
where it was, never queued and answered again as a new message. After a restart of one
process it is announced as interrupted — its preview, then the "interrupted — /resume"
notice, once; with several workers, the one that takes it over resumes it at once, and its
answer comes below the preview (which it cannot retract: the dead worker never heard it was
posted).

The hard way: real processes, the fake Slack and the fake LLM. The process is killed with
SIGKILL while the fake Slack holds the preview's `chat.postMessage` (the message is in the
chat; the process never hears so). The preview must not have been posted before the run's
start was committed: the test holds that commit back at the wire (a proxy in front of
PostgreSQL; another writer holding SQLite's write lock) for a while, so a preview posted
early reaches the chat, and the process dies, with the commit still on its way."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from core.store import RunRow, open_store
from tests.channels.test_stored_before_ack import Parley, free_port, parley_run
from tests.fakes.holding_proxy import HoldingProxy
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack, Posted
from tests.process import child_env, slack_run_config
from tests.store.conftest import postgres_schema
from tests.test_workers_processes import SIGNING_SECRET, slack_config
from tests.workerskit import INTERRUPTED, worker

ANSWER = "pong " * 40
HOLD = 1.5  # seconds the run's first commit is held back (under SQLite's busy timeout)


def _answer(request: RecordedRequest) -> Reply:
    return Reply(text=ANSWER, chunk_size=10, chunk_delay=0.2)  # 4 s: longer than HOLD


def kill_on_first_post(slack: FakeSlack, channel: str, victim: Parley) -> asyncio.Event:
    """Kill `victim` once its first post to `channel` is in the chat, before it is told;
    the event is set once it is dead."""
    dead = asyncio.Event()

    async def kill(params: dict[str, Any]) -> None:
        if params.get("channel") == channel and not dead.is_set():
            await victim.kill()
            dead.set()

    slack.before_answer["chat.postMessage"] = kill
    return dead


async def killed_within(dead: asyncio.Event, hold: float, release: Callable[[], None]) -> bool:
    """Wait for the kill while the commit is held; True if the preview came meanwhile.
    Else release the commit (the preview waits for it) and wait for the kill."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(dead.wait(), hold)
    if dead.is_set():
        return True  # the held commit is never let through: the process died without it
    release()
    await asyncio.wait_for(dead.wait(), 30)
    return False


def posts(slack: FakeSlack, channel: str) -> list[Posted]:
    return sorted(
        (m for m in slack.live_messages() if m.channel == channel), key=lambda m: float(m.ts)
    )


async def settled(slack: FakeSlack, channel: str, run: Callable[[], Awaitable[RunRow]]) -> None:
    """Wait until the run is over (taken over, or answered again) and the chat shows it."""
    try:
        async with asyncio.timeout(60):
            while True:
                row = await run()
                texts = [m.text for m in posts(slack, channel)]
                if row.state == "timed_out" and any(INTERRUPTED.search(t) for t in texts):
                    break
                if row.state == "completed" and len(texts) > 1:
                    break
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not settled: run {row}, chat {texts}") from None
    await asyncio.sleep(1.0)  # anything more would come now (the sweep runs twice a second)


async def resumed(slack: FakeSlack, channel: str, run: Callable[[], Awaitable[RunRow]]) -> None:
    """Wait until the run taken over has ended and its answer is in the chat."""
    try:
        async with asyncio.timeout(60):
            while True:
                row = await run()
                texts = [m.text.strip() for m in posts(slack, channel)]
                if row.state == "completed" and ANSWER.strip() in texts:
                    break
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not resumed: run {row}, chat {texts}") from None
    await asyncio.sleep(1.0)  # anything more would come now (the sweep runs twice a second)


def assert_answered_once(
    slack: FakeSlack, channel: str, run: RunRow, llm: FakeLLM, message: str
) -> None:
    """One answer (the preview, cut short by the kill), one notice, one LLM call."""
    texts = [m.text for m in posts(slack, channel)]
    answers = [t for t in texts if t.startswith("pong")]
    assert len(answers) == 1, f"answered twice: {texts}"
    assert ANSWER.strip() not in answers, "the preview was the whole answer: the test is void"
    notices = [t for t in texts if (found := INTERRUPTED.search(t)) and found[1] == run.id]
    assert len(notices) == 1, texts
    assert (run.state, run.resumable) == ("timed_out", True)
    asked = [r for r in llm.requests if r.json["messages"][-1]["content"] == message]
    assert len(asked) == 1


async def test_a_worker_killed_after_posting_a_preview_is_taken_over_not_answered_again(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    ports = [free_port(), free_port()]
    async with FakeSlack() as slack, postgres_schema() as url:
        env = child_env(
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            SLACK_SIGNING_SECRET=SIGNING_SECRET,
        )
        async with HoldingProxy.before(url) as proxy:
            config = slack_config(tmp_path, 0, fake_llm, slack, proxy.url(url), ports[0])
            async with worker(config, env) as victim:
                dead = kill_on_first_post(slack, "D1", victim)
                slack.http_target = (f"http://127.0.0.1:{ports[0]}/slack/events", SIGNING_SECRET)
                proxy.arm(b"INSERT INTO checkpoints")  # the commit of the run's start
                envelope = await slack.dm("ping")
                assert envelope.http_status == 200
                await fake_llm.wait_for_requests(1)
                early = await killed_within(dead, HOLD, proxy.release)
                proxy.drop()  # what the dead worker left unsent never arrives
        assert early or proxy.held.is_set(), "the commit was not held: the test is void"
        # Another worker finds the dead one silent and takes its run over.
        survivor = slack_config(tmp_path, 1, fake_llm, slack, url, ports[1])
        async with worker(survivor, env) as other, await open_store(url) as store:
            [queued] = await store.runs(conv="slack:D1:")

            async def run() -> RunRow:
                row = await store.run(queued.id)
                assert row is not None
                return row

            await resumed(slack, "D1", run)
            texts = [m.text for m in posts(slack, "D1")]
            events = [e[1] for e in await store.events(queued.id)]
            assert await other.stop() == 0
    # The cut-short preview, then the whole answer below it; nothing else.
    assert len(texts) == 2, texts
    assert ANSWER.startswith(texts[0]), texts
    assert texts[0].strip() != ANSWER.strip(), "the preview was the whole answer: the test is void"
    assert texts[1].strip() == ANSWER.strip()
    # Gone on with from its checkpoint, not queued again as if it had never begun.
    assert "agent_run.resumed" in events
    assert "agent_run.requeued" not in events
    asked = [r for r in fake_llm.requests if r.json["messages"][-1]["content"] == "ping"]
    assert len(asked) == 2  # by the dead worker, then by the one that went on with it
    assert [m["content"] for m in asked[1].json["messages"] if m["role"] == "user"] == ["ping"]


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[sqlite3.Connection]:
    """Another writer takes the store's write lock (Parley's commits wait, reads go on);
    its transaction's snapshot is the database as of taking it."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        conn.close()


async def test_a_process_killed_after_posting_a_preview_announces_the_run_after_restart(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    port = free_port()
    db = tmp_path / "parley.db"
    async with FakeSlack() as slack:
        extra = f'mode = "http"\nhttp_port = {port}\n'
        config, env = slack_run_config(tmp_path, fake_llm.base_url, slack, extra, SIGNING_SECRET)
        slack.http_target = (f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET)
        caught = None
        async with parley_run(config, env) as parley:
            # The lock must come between the message's commit (before Slack's 200) and the
            # commit of its run's start, a few ms later: tried in a fresh DM until it does.
            for attempt in range(8):
                channel = f"D{attempt}"
                envelope = await slack.dm(f"ping {attempt}", channel=channel)
                assert envelope.http_status == 200
                with write_lock(db) as lock:
                    [(state,)] = lock.execute(
                        "SELECT state FROM runs WHERE conv = ?", (f"slack:{channel}:",)
                    ).fetchall()
                    if state == "queued":  # no preview can have come yet: nothing awaited
                        caught = channel
                        dead = kill_on_first_post(slack, channel, parley)
                        await killed_within(dead, HOLD, lock.rollback)
                        break
                await slack.until(  # missed: that message is simply answered
                    lambda c=channel: any(
                        m.text.strip() == ANSWER.strip() for m in posts(slack, c)
                    ),
                    30,
                    "the answer",
                )
        assert caught is not None, "the run's start was always committed first: the test is void"
        async with parley_run(config, env) as parley, await open_store(db) as store:
            [queued] = await store.runs(conv=f"slack:{caught}:")

            async def run() -> RunRow:
                row = await store.run(queued.id)
                assert row is not None
                return row

            await settled(slack, caught, run)
            assert_answered_once(slack, caught, await run(), fake_llm, f"ping {caught[1:]}")
            assert await parley.stop() == 0
