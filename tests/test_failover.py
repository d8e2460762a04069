"""Leased singletons fail over between `parley run` workers (docs/scale-out.md), the hard way: two
real workers on one PostgreSQL (a schema of their own), the fake platforms and the fake
LLM; the worker holding the singletons is killed with SIGKILL, and the other takes them
over within seconds.

- Telegram: messages before the kill are answered by the first worker, messages sent after
  it by the second; each exactly once, none lost (updates are confirmed only once stored,
  so the successor fetches whatever its predecessor had not taken in).
- Scheduler: a job firing every second keeps firing across the kill; every slot is claimed
  once, and none is missing between the first and the last (the successor catches up the
  slots its predecessor missed, within the misfire grace).
- Discord: the gateway (shard 0) moves to the other worker, which answers the next DM;
  Discord saw one IDENTIFY per tenure of the lease, never two sessions at once.

A message the dead worker had stored but not yet answered is the workers' reconcile's to
finish (a dead worker's runs), not these leases'; the kill here comes while it is idle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from tests.channels.test_stored_before_ack import Parley
from tests.fakes.discord import DM_CHANNEL_ID, FakeDiscord
from tests.fakes.discord import TOKEN as DISCORD_TOKEN
from tests.fakes.discord import USER as DISCORD_USER
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config, start_parley
from tests.store.conftest import postgres_schema

ALICE = TgUser(111, "Alice", "alice")
TOKEN = "123456:TEST-token"
POLL_LEASE = "telegram:poll:123456"
LEASE_SECONDS = 1
TAKEOVER_BOUND = 15.0  # seconds: lease 1 s, retry 1/3 s, on a loaded 2-core machine


def _pong(request: RecordedRequest) -> Reply:
    return Reply(text=f"pong: {request.json['messages'][-1]['content']}")


def worker_config(
    state: Path, url: str, llm: str, telegram: str, extra: str = "", lease: int = LEASE_SECONDS
) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    section = f"""
        [channels.telegram]
        enabled = true
        base_url = "{telegram}"
        allow_users = ["{ALICE.id}"]
        allow_channels = ["{ALICE.id}"]
        """
    store = f'url = "{url}"\nlease_seconds = {lease}'
    config = state / "config.toml"
    config.write_text(
        fake_llm_config(llm, state, textwrap.dedent(section) + textwrap.dedent(extra), store=store)
    )
    return config


def events(state: Path, name: str) -> list[dict[str, Any]]:
    path = state / "events.jsonl"
    if not path.exists():
        return []
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [e for e in lines if e.get("event") == name]


def holds(parley: Parley, lease: str) -> bool:
    return f"parley: lease {lease} taken".encode() in parley.err


@asynccontextmanager
async def two_workers(
    tmp_path: Path,
    llm: FakeLLM,
    telegram: FakeTelegram,
    extra: str = "",
    lease: int = LEASE_SECONDS,
    first: str = POLL_LEASE,
) -> AsyncIterator[tuple[Parley, Parley, str]]:
    """Worker a (started first: it takes every lease, `first` is waited for) and worker b,
    on one fresh schema; `extra` TOML is appended to their configuration."""
    env = child_env(TELEGRAM_BOT_TOKEN=TOKEN, DISCORD_BOT_TOKEN=DISCORD_TOKEN)
    async with postgres_schema() as url, AsyncExitStack() as stack:
        workers = []
        for name in ("a", "b"):
            config = worker_config(tmp_path / name, url, llm.base_url, telegram.url, extra, lease)
            proc = await start_parley("--config", str(config), "run", env=env, stdin=False)
            worker = Parley(proc)
            stack.push_async_callback(_ended, worker)
            await worker.until(lambda w=worker: b"parley: ready" in w.err, f"{name} ready")
            if name == "a":
                await worker.until(lambda w=worker: holds(w, first), f"a holding {first}")
            workers.append(worker)
        yield workers[0], workers[1], url


async def _ended(worker: Parley) -> None:
    if worker.proc.returncode is None:
        await worker.kill()


async def until_completed(url: str, runs: int) -> None:
    """Until `runs` runs are recorded completed, their answers recorded as taken by the
    platform (a worker killed between posting an answer and recording it is the workers'
    takeover's case — it posts the answer again — not the leases')."""
    import psycopg

    async def count() -> int:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM runs WHERE state = 'completed' AND reply IS NULL"
            )
            row = await cursor.fetchone()
            return int(row[0]) if row else 0

    deadline = time.monotonic() + 30
    while await count() < runs:
        assert time.monotonic() < deadline, f"fewer than {runs} runs completed in 30 s"
        await asyncio.sleep(0.05)


async def job_runs(url: str) -> list[tuple[float, str, bool]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(
            "SELECT fire_time, state, delivered FROM job_runs WHERE job = 'tick' ORDER BY fire_time"
        )
        return [(float(t), str(s), bool(d)) for t, s, d in await cursor.fetchall()]


async def test_telegram_polling_moves_to_another_worker_when_its_holder_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _pong
    async with (
        FakeTelegram(token=TOKEN) as telegram,
        two_workers(tmp_path, fake_llm, telegram) as (a, b, url),
    ):
        assert not holds(b, POLL_LEASE)
        telegram.dm(ALICE, "before 1")
        telegram.dm(ALICE, "before 2")
        await telegram.wait_until(lambda: len(telegram.texts(ALICE.id)) == 2, what="answers")
        await until_completed(url, 2)  # killed while idle (see the module doc)

        await a.kill()
        killed = time.monotonic()
        for n in range(1, 4):  # nobody polls until b takes over: Telegram keeps them
            telegram.dm(ALICE, f"after {n}")
        await b.until(lambda: holds(b, POLL_LEASE), "b polling", timeout=TAKEOVER_BOUND)
        await telegram.wait_until(
            lambda: len(telegram.texts(ALICE.id)) == 5, timeout=30, what="answers after the kill"
        )
        failover = time.monotonic() - killed
        telegram.dm(ALICE, "later")
        await telegram.wait_until(lambda: len(telegram.texts(ALICE.id)) == 6, what="b answering")
        assert await b.stop() == 0

    expected = ["before 1", "before 2", "after 1", "after 2", "after 3", "later"]
    assert sorted(telegram.texts(ALICE.id)) == sorted(f"pong: {t}" for t in expected)
    assert len(fake_llm.requests) == 6  # each answered once: no turn ran twice
    # Any worker answers any message (the poller only takes them in): the one alive after
    # the kill answered every message sent after it.
    answered_by_a = len(events(tmp_path / "a", "agent_run.completed"))
    answered_by_b = len(events(tmp_path / "b", "agent_run.completed"))
    assert answered_by_a + answered_by_b == 6
    assert answered_by_b >= 4
    assert b"lease telegram:poll:123456 released" in b.err  # a clean stop hands it back
    assert failover < TAKEOVER_BOUND + 30


JOB = """
    [[jobs]]
    name = "tick"
    schedule = "* * * * * *"
    channel = "telegram:111"
    prompt = "tick"
    misfire_grace_seconds = 60
    """


async def test_the_scheduler_moves_to_another_worker_and_no_slot_fires_twice_or_is_lost(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _pong
    async with FakeTelegram(token=TOKEN) as telegram:
        telegram.add_chat(ALICE.id, title="reports")  # where the job posts
        # a 3 s lease: b takes over 1-4 s after the kill, so several slots are missed
        async with two_workers(tmp_path, fake_llm, telegram, JOB, lease=3) as (a, b, url):
            await a.until(lambda: holds(a, "scheduler"), "a scheduling")
            assert not holds(b, "scheduler")
            await telegram.wait_until(
                lambda: len(telegram.texts(ALICE.id)) >= 2, timeout=20, what="two fires by a"
            )
            await a.kill()
            killed = time.time()
            await b.until(lambda: holds(b, "scheduler"), "b scheduling", timeout=TAKEOVER_BOUND)
            await b.until(
                lambda: len(events(tmp_path / "b", "job.finished")) >= 3, "three fires by b", 30
            )
            assert await b.stop() == 0
            runs = await job_runs(url)

    fires = [t for t, _, _ in runs]
    assert len(set(fires)) == len(fires)
    steps = [later - earlier for earlier, later in itertools.pairwise(fires)]
    assert steps == [1.0] * (len(fires) - 1), f"a slot is missing: {fires}"
    assert fires[-1] > killed  # b fired after the kill
    unfinished = [(t, s) for t, s, _ in runs if s != "completed"]
    # At most the fire a was running when it died: claimed (never run again), reported as
    # interrupted by b (issue 23), or not yet when b stopped.
    assert len(unfinished) <= 1
    assert all(t <= killed for t, _ in unfinished)
    posted = telegram.texts(ALICE.id)
    reported = [p for p in posted if p.startswith("⚠ Job tick (")]
    assert len(reported) <= len(unfinished)
    delivered = sum(delivered for _, _, delivered in runs)
    # The unfinished fire may have posted before a died (its row says nothing of it yet).
    assert delivered <= len(posted) <= delivered + len(unfinished)
    assert set(posted) - set(reported) == {"pong: tick"}
    started_a = len(events(tmp_path / "a", "job.started"))
    started_b = len(events(tmp_path / "b", "job.started"))
    assert started_a + started_b == len(runs)  # every claim ran exactly one fire


async def test_the_discord_gateway_moves_to_another_worker_when_its_holder_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _pong
    async with FakeDiscord() as discord, FakeTelegram(token=TOKEN) as telegram:
        section = f"""
            [channels.discord]
            enabled = true
            api_base_url = "{discord.url}"
            gateway_url = "{discord.gateway_url}"
            allow_users = ["{DISCORD_USER.id}"]
            """
        async with two_workers(tmp_path, fake_llm, telegram, section, first="discord:shard:0") as (
            a,
            b,
            url,
        ):
            assert not holds(b, "discord:shard:0")
            await discord.dm("before")
            await discord.wait_until(lambda: discord.bot_texts(DM_CHANNEL_ID) == ["pong: before"])
            await until_completed(url, 1)  # killed while idle (see the module doc)
            await a.kill()
            await b.until(lambda: holds(b, "discord:shard:0"), "b on the gateway", TAKEOVER_BOUND)
            await discord.dm("after")  # waits for b's IDENTIFY
            await discord.wait_until(
                lambda: len(discord.bot_texts(DM_CHANNEL_ID)) == 2, timeout=30, what="b's answer"
            )
            assert await b.stop() == 0
            tenures = sum(w.err.count(b"parley: lease discord:shard:0 taken") for w in (a, b))
    assert discord.bot_texts(DM_CHANNEL_ID) == ["pong: before", "pong: after"]
    # One IDENTIFY per tenure: a's, then b's (a loaded machine may lose and retake the
    # 1-second lease, which is one more of each), and never two sessions at once.
    assert 2 <= len(discord.calls_of("gateway.identify")) <= tenures
    assert discord.most_sessions == 1
    completed = [tmp_path / w for w in ("a", "b")]
    assert sum(len(events(w, "agent_run.completed")) for w in completed) == 2
