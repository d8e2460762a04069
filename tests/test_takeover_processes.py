"""Takeover without loss (issue 23), the hard way: real `parley run` workers on
one PostgreSQL schema, the fake Telegram and the fake LLM; a worker killed with SIGKILL,
or stopped with SIGSTOP past `worker_timeout_seconds` and continued.

- Telegram by webhook behind a balancer, conversations busy (several messages queued in
  each) when a worker running turns is killed: every message ends with exactly one answer,
  in order, and a retracted preview is followed by its whole answer (tests.workerskit's
  rules; long polling is tests/test_workers_processes.py's).
- A worker frozen past the timeout, then thawed: its turn was taken over and answered
  once by another worker, and the thawed one makes no platform call for it.
- A turn killed while a side-effecting call ran: going on could repeat it, so its
  conversation pauses — the messages behind it wait — until `/resume` (it goes on without
  running the call again) or `/skip` (the messages go on).
- Cron fires killed mid-answer: `on_interrupt = "rerun"` goes on with the fire, `report`
  posts that it was interrupted (with the job's name and slot); either way the fire's row
  is closed, and `parley jobs runs` shows it.
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from core.agent.recovery import PREVIEW_RETRACTED
from core.store import JobRunRecord, RunRow, Store, open_store
from tests.channels.test_stored_before_ack import Parley, free_port
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply, ToolCallSpec
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config, parley
from tests.store.conftest import postgres_schema
from tests.test_workers_processes import until_stored
from tests.workerskit import (
    SlowPong,
    await_outcomes,
    check_outcomes,
    check_retractions,
    kill_when_running,
    shared_store,
    worker,
)

TOKEN = "123456:TEST-token"
SECRET = "webhook-secret"
USERS = [TgUser(7100 + n, f"User {n}", f"u{n}") for n in range(12)]
REPORTS = -1007  # the group cron jobs post to
ENV = child_env(TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_WEBHOOK_SECRET=SECRET)
PLATFORM_CALLS = ("sendMessage", "editMessageText", "deleteMessage", "sendChatAction")


def config(
    tmp_path: Path, name: str, llm: FakeLLM, telegram: FakeTelegram, url: str, extra: str = ""
) -> Path:
    """Worker `name`'s config.toml: the shared store (quick takeovers: a worker is dead
    after 2 s), its own state dir, the fake Telegram (`extra` TOML inside its section,
    then any further sections); every test user may talk to the bot."""
    state = tmp_path / name
    state.mkdir()
    allowed = ", ".join(f'"{user.id}"' for user in USERS)
    text = fake_llm_config(
        llm.base_url,
        state,
        f"""
        [channels.telegram]
        enabled = true
        base_url = "{telegram.url}"
        allow_users = [{allowed}]
        allow_channels = ["{REPORTS}"]
        drafts = false  # previews are edited messages: what a taker retracts
        """
        + textwrap.dedent(extra),
    )
    path = state / "config.toml"
    path.write_text(shared_store(text, url))
    return path


def by_pid(workers: list[Parley], run: RunRow) -> Parley | None:
    """The worker whose run `run` is (its id is `host:pid:…`)."""
    return next((w for w in workers if f":{w.proc.pid}:" in (run.worker or "")), None)


async def until_store(url: str, condition: Callable[[Store], Awaitable[Any]], what: str) -> Any:
    """Until `condition(store)` is truthy (30 s at most); its value."""
    async with await open_store(url) as store:
        try:
            async with asyncio.timeout(30):
                while not (found := await condition(store)):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"no {what} within 30 s") from None
        return found


def last_user(request: RecordedRequest) -> str:
    return next(m["content"] for m in reversed(request.json["messages"]) if m["role"] == "user")


# --- Telegram by webhook, busy conversations, a worker killed ---------------------------------


class Balancer:
    """Telegram's side of a load balancer: each update goes to the next worker; one that
    fails it (down, dying, or answering an error) gets it no more, and the next one is
    tried (Telegram retries a webhook that did not answer 200)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.down, self.turn = ports, set[int](), 0
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/telegram"

    async def __aenter__(self) -> Balancer:
        app = web.Application()
        app.router.add_post("/telegram", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-")}
        headers["Content-Type"] = "application/json"
        async with aiohttp.ClientSession() as session:
            for _ in range(len(self.ports) * 3):
                live = [p for p in self.ports if p not in self.down] or self.ports
                port = live[self.turn % len(live)]
                self.turn += 1
                try:
                    target = f"http://127.0.0.1:{port}/telegram"
                    async with session.post(target, data=body, headers=headers) as answer:
                        if answer.status == 200:
                            return web.Response(text="ok")
                except (aiohttp.ClientError, OSError):
                    self.down.add(port)
                    continue
                await asyncio.sleep(0.1)
        return web.Response(status=502)


async def test_telegram_webhook_workers_answer_every_message_once_when_one_is_killed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = llm = SlowPong()
    users, rounds = USERS[:10], 5
    ports = [free_port() for _ in range(3)]
    async with (
        FakeTelegram(token=TOKEN) as telegram,
        postgres_schema() as url,
        Balancer(ports) as balancer,
    ):
        configs = [
            config(
                tmp_path,
                f"w{n}",
                fake_llm,
                telegram,
                url,
                f'mode = "webhook"\nwebhook_url = "{balancer.url}"\nwebhook_port = {port}\n',
            )
            for n, port in enumerate(ports)
        ]
        async with (
            worker(configs[0], ENV) as first,
            worker(configs[1], ENV) as second,
            worker(configs[2], ENV) as third,
        ):
            workers = [first, second, third]
            sent: dict[str, str] = {}
            for n in range(rounds):
                for c, user in enumerate(users):
                    text = f"c{c} m{n}"
                    sent[text] = str(user.id)
                    telegram.dm(user, text)
                # Telegram posts one chat's updates one at a time, each once the one
                # before was taken (the fake posts them all at once): a round at a time.
                stored = until_stored(url, len(sent))
                if n == 2:  # three messages in, two more to come: busy conversations
                    await asyncio.gather(stored, kill_when_running(url, llm, lambda: second))
                else:
                    await stored

            def posts() -> list[tuple[str, str]]:
                return [(str(u.id), t) for u in users for t in telegram.texts(u.id)]

            found = await await_outcomes(url, posts, sent, "telegram", workers)
            assert await first.stop() == 0
            assert await third.stop() == 0
    check_outcomes(found, posts, sent)
    check_retractions(telegram, [u.id for u in users])


# --- a worker frozen past the timeout ----------------------------------------------------------


class FirstSlow:
    """The fake LLM's answers: a message's first asking streams a long answer slowly (a
    worker frozen meanwhile has text left to show); asked again (the turn resumed
    elsewhere), a short one at once."""

    def __init__(self, more: int = 80) -> None:
        self.asked: Counter[str] = Counter()
        self.more = more  # 6 characters every 0.05 s: 80 take 6 s

    def __call__(self, request: RecordedRequest) -> Reply:
        text = last_user(request)
        self.asked[text] += 1
        if self.asked[text] == 1:
            long = f"pong: {text} " + "and more " * self.more
            return Reply(text=long, chunk_size=6, chunk_delay=0.05)
        return Reply(text=f"pong: {text}")


async def _quiet(telegram: FakeTelegram, chat: int, *, still: float = 1.0) -> None:
    """Wait (at most 15 s) until no call for `chat` has reached the fake for `still`
    seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15

    def count() -> int:
        return sum(1 for c in telegram.calls if str(c.params.get("chat_id")) == str(chat))

    seen, since = count(), loop.time()
    while loop.time() < deadline and loop.time() - since < still:
        await asyncio.sleep(0.05)
        if (now := count()) != seen:
            seen, since = now, loop.time()


async def test_a_worker_frozen_past_the_timeout_touches_nothing_of_its_turn_when_thawed(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = FirstSlow()
    alice = USERS[0]
    async with FakeTelegram(token=TOKEN) as telegram, postgres_schema() as url:
        configs = [config(tmp_path, name, fake_llm, telegram, url) for name in ("a", "b")]
        async with worker(configs[0], ENV) as a, worker(configs[1], ENV) as b:
            telegram.dm(alice, "hello")

            async def previewing(store: Store) -> RunRow | None:
                """The turn, once its preview is up and recorded (its taker retracts it)."""
                for run in await store.runs(states=["running"], limit=5):
                    events = [e[1] for e in await store.events(run.id)]
                    if "channel.preview.posted" in events:
                        return run
                return None

            run = await until_store(url, previewing, "recorded preview")
            frozen = by_pid([a, b], run)
            assert frozen is not None
            other = b if frozen is a else a
            frozen.proc.send_signal(signal.SIGSTOP)
            try:

                async def answered(store: Store) -> bool:
                    row = await store.run(run.id)
                    return row is not None and row.state == "completed"

                await until_store(url, answered, "answer by the other worker")
                await telegram.wait_until(
                    lambda: "pong: hello" in telegram.texts(alice.id), timeout=30, what="answer"
                )
                # The taker may still be ending its typing indicator in the chat: mark where
                # the thawed worker's calls would start only once the chat has gone quiet.
                await _quiet(telegram, alice.id)
                thawed_at = len(telegram.calls)
            finally:
                frozen.proc.send_signal(signal.SIGCONT)
            await frozen.until(
                lambda: f"run {run.id} was taken over".encode() in frozen.err,
                "the thawed worker stopping its turn",
            )
            after = [
                (c.method, c.params.get("text"))
                for c in telegram.calls[thawed_at:]
                if c.method in PLATFORM_CALLS and str(c.params.get("chat_id")) == str(alice.id)
            ]
            assert after == [], "the thawed worker spoke for the turn it lost"
            assert await other.stop() == 0
            assert await frozen.stop() == 0
    assert telegram.texts(alice.id) == [PREVIEW_RETRACTED, "pong: hello"]
    # the start-up line says which database was opened
    assert b"; store PostgreSQL " in a.err
    assert b" database " in a.err
    assert check_retractions(telegram, [alice.id]) == 1


# --- a side-effecting call cut off: the conversation pauses ---------------------------------


def tooling(request: RecordedRequest) -> Reply:
    """`run it` starts a long side-effecting command; a turn going on after it answers
    with what the call's result says; anything else is ponged."""
    messages = request.json["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(text=f"went on: {messages[-1]['content'][:40]}")
    text = last_user(request)
    if text.startswith("run it"):
        return Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 120"})])
    return Reply(text=f"pong: {text}")


async def test_a_turn_cut_off_in_a_side_effecting_call_pauses_its_conversation(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = tooling
    resumer, skipper = USERS[0], USERS[1]
    async with FakeTelegram(token=TOKEN) as telegram, postgres_schema() as url:
        names = ("a", "b", "c")
        configs = [config(tmp_path, name, fake_llm, telegram, url) for name in names]
        async with (
            worker(configs[0], ENV) as a,
            worker(configs[1], ENV) as b,
            worker(configs[2], ENV) as c,
        ):
            workers = [a, b, c]
            telegram.dm(resumer, "run it 1")
            telegram.dm(skipper, "run it 2")

            async def running_calls(store: Store) -> list[RunRow] | None:
                """Both turns, once each is inside its call (started, not finished)."""
                found = []
                for run in await store.runs(states=["running"], limit=10):
                    calls = await store.tool_calls(run.id)
                    if any(not call.completed for call in calls.values()):
                        found.append(run)
                return found if len(found) == 2 else None

            runs = await until_store(url, running_calls, "two turns inside their calls")
            for user, text in ((resumer, "next 1a"), (resumer, "next 1b"), (skipper, "next 2")):
                telegram.dm(user, text)

            async def queued(store: Store) -> bool:
                return len(await store.runs(states=["queued"], limit=10)) == 3

            await until_store(url, queued, "the messages queued behind them")
            victims = {by_pid(workers, run) for run in runs}
            for victim in victims:
                assert victim is not None
                await victim.kill()
            for user in (resumer, skipper):
                await telegram.wait_until(
                    lambda u=user: any("not safe" in t for t in telegram.texts(u.id)),
                    timeout=30,
                    what="the pause notice",
                )
            [notice] = [t for t in telegram.texts(resumer.id) if "not safe" in t]
            assert "bash had started but not finished" in notice  # `bash`, as code
            assert "/resume" in notice
            assert "/skip" in notice
            assert "The 2 messages you sent since wait until then." in notice
            telegram.command(resumer, "status")
            await telegram.wait_until(
                lambda: any("waits for /resume or /skip" in t for t in telegram.texts(resumer.id)),
                timeout=30,
                what="status",
            )
            [status] = [t for t in telegram.texts(resumer.id) if "waits for /resume" in t]
            assert "2 queued" in status
            assert not [t for t in telegram.texts(resumer.id) if t.startswith("pong:")]

            telegram.command(resumer, "resume")
            telegram.command(skipper, "skip")
            await telegram.wait_until(
                lambda: (
                    telegram.texts(resumer.id)[-1:] == ["pong: next 1b"]
                    and telegram.texts(skipper.id)[-1:] == ["pong: next 2"]
                ),
                timeout=30,
                what="the queued messages answered",
            )
            async with await open_store(url) as store:
                states = {r.text: r.state for r in await store.runs(limit=20)}
            for survivor in workers:
                if survivor.proc.returncode is None:
                    assert await survivor.stop() == 0
    resumed = telegram.texts(resumer.id)
    assert resumed[0] == notice
    assert resumed[2].startswith("went on: interrupted by a restart")  # not run again
    assert resumed[3:] == ["pong: next 1a", "pong: next 1b"]
    skipped = telegram.texts(skipper.id)
    assert skipped[1].startswith("Skipped the interrupted run")
    assert skipped[2:] == ["pong: next 2"]
    assert "cancelled" in states.values()  # the skipped turn


# --- cron fires killed mid-answer -------------------------------------------------------------


def jobs(at: datetime) -> str:
    """Two daily jobs due at `at` (a moment ago): their missed fire runs as soon as a worker
    holds the scheduler."""
    schedule = f"{at.second} {at.minute} {at.hour} * * *"
    return "".join(
        f"""
        [[jobs]]
        name = "{name}"
        schedule = "{schedule}"
        channel = "telegram:{REPORTS}"
        prompt = "tick {name}"
        misfire_grace_seconds = 3600
        {setting}
        """
        for name, setting in (("again", 'on_interrupt = "rerun"'), ("tell", ""))
    )


async def test_cron_fires_killed_mid_answer_are_gone_on_with_or_reported(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = FirstSlow(more=400)  # 30 s: killed long before its end
    due = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    async with FakeTelegram(token=TOKEN) as telegram, postgres_schema() as url:
        telegram.add_chat(REPORTS, title="reports")
        async with await open_store(url) as store:  # yesterday's fires ran: today's is due
            for job in ("again", "tell"):
                fire = await store.claim_job_fire(job, (due - timedelta(days=1)).timestamp())
                assert fire is not None
                await store.finish_job_run(
                    fire, state="completed", run_id=None, result="ok", delivered=True, error=None
                )
        configs = [
            config(tmp_path, name, fake_llm, telegram, url, jobs(due)) for name in ("a", "b")
        ]
        async with worker(configs[0], ENV) as a, worker(configs[1], ENV) as b:

            async def both_answering(store: Store) -> list[RunRow] | None:
                runs = list(await store.runs(states=["running"], limit=10))
                fires = [r for r in runs if r.trigger == "cron" and r.conv.startswith("cron:")]
                for run in fires:
                    if await store.last_checkpoint(run.id) is None:
                        return None
                return fires if len(fires) == 2 else None

            fires = await until_store(url, both_answering, "both fires in their answers")
            [holder] = {by_pid([a, b], run) for run in fires}
            assert holder is not None
            survivor = b if holder is a else a
            await holder.kill()
            await telegram.wait_until(
                lambda: len(telegram.texts(REPORTS)) == 2, timeout=30, what="two reports"
            )

            async def both_recorded(store: Store) -> dict[str, JobRunRecord] | None:
                # the report is posted first, then its fire's row is closed
                found = {job: (await store.job_runs(job))[0] for job in ("again", "tell")}
                return None if any(r["state"] == "running" for r in found.values()) else found

            rows = await until_store(url, both_recorded, "both fires' rows closed")
            assert await survivor.stop() == 0
        _, listed, _ = await parley("--config", str(configs[1]), "jobs", "runs", "tell", env=ENV)
    posts = telegram.texts(REPORTS)
    assert "pong: tick again" in posts
    slot = due.strftime("%Y-%m-%d %H:%M:%S UTC").replace(":00 ", " ", 1)
    [told] = [p for p in posts if p.startswith("⚠")]
    assert told.startswith(f"⚠ Job tell ({slot}) was interrupted: the worker running it")
    again, tell = rows["again"], rows["tell"]
    assert (again["state"], again["delivered"], again["result"]) == (
        "completed",
        True,
        "pong: tick again",
    )
    assert (tell["state"], tell["delivered"]) == ("timed_out", True)
    assert tell["error"] is not None
    assert "interrupted" in tell["error"]
    lines = listed.splitlines()
    assert lines[0].split() == ["fire", "state", "delivered", "run", "result"]
    assert "timed_out" in lines[1]
    assert "the worker running it stopped" in lines[1]
    assert "completed" in lines[2]  # yesterday's
