"""Triggers served by two `parley run` workers on one PostgreSQL store (docs/triggers.md,
docs/scale-out.md): each worker has its own `[server] listen` port, as behind a load
balancer; they share the store, the fake Slack and the fake LLM. A delivery sent to both
at once is taken once, the rate limit is one count for both, and a delivery acknowledged
by a worker that dies right after its 202 is run by the other."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from core.store import RunRow, open_store
from tests.channels.test_stored_before_ack import Parley
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack, Posted
from tests.store.conftest import postgres_schema
from tests.triggers.hookkit import (
    CI_TRIGGER,
    check_run,
    counted,
    deliver,
    run_config,
    signed,
    within_one_minute,
)
from tests.workerskit import worker

HEADER = "[ci] acme/widgets#abc123"
Workers = tuple[tuple[Parley, Parley], tuple[str, str]]


def _answer(request: RecordedRequest) -> Reply:
    users = [m for m in request.json["messages"] if m["role"] == "user"]
    return Reply(text=f"looked at {len(users)} message(s)")


def _headers(slack: FakeSlack) -> list[Posted]:
    return [m for m in slack.live_messages() if m.text.startswith("[ci]")]


def _answers(slack: FakeSlack) -> list[Posted]:
    return [m for m in slack.live_messages() if m.text.startswith("looked at")]


@contextlib.asynccontextmanager
async def two_workers(
    tmp_path: Path, llm: FakeLLM, slack: FakeSlack, store_url: str, triggers: str = CI_TRIGGER
) -> AsyncIterator[Workers]:
    """Workers A and B on the store at `store_url`; yields them and their base URLs."""
    a_config, a_env, a_url = run_config(
        tmp_path / "a", llm.base_url, slack, triggers, store_url=store_url
    )
    b_config, b_env, b_url = run_config(
        tmp_path / "b", llm.base_url, slack, triggers, store_url=store_url
    )
    async with worker(a_config, a_env) as a, worker(b_config, b_env) as b:
        await slack.connected(sessions=2)
        yield (a, b), (a_url, b_url)


async def _settled_runs(store_url: str, count: int) -> list[RunRow]:
    """Once `count` runs are stored and none is queued or running: the runs."""
    async with await open_store(store_url) as store, asyncio.timeout(30):
        while True:
            runs = await store.runs(limit=100)
            if len(runs) >= count and all(r.state not in ("queued", "running") for r in runs):
                return runs
            await asyncio.sleep(0.1)


async def _counted(urls: tuple[str, str]) -> dict[tuple[str, str], float]:
    """The deliveries each worker counted, summed."""
    total: dict[tuple[str, str], float] = {}
    for url in urls:
        for key, value in (await counted(url)).items():
            total[key] = total.get(key, 0) + value
    return total


async def test_one_delivery_sent_to_both_workers_at_once_is_taken_once_and_answered_once(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with (
        FakeSlack() as slack,
        postgres_schema() as store_url,
        two_workers(tmp_path, fake_llm, slack, store_url) as ((a, _), urls),
    ):
        body, headers = signed(check_run(), delivery="raced")
        replies = await asyncio.gather(*(deliver(url, "ci", body, headers) for url in urls))
        outcomes = sorted((r.status_code, r.json()["outcome"]) for r in replies)
        assert outcomes == [(200, "duplicate"), (202, "accepted")]
        await a.until(lambda: _answers(slack), "the answer")
        runs = await _settled_runs(store_url, 1)
        counts = await _counted(urls)

    assert [(r.state, r.trigger) for r in runs] == [("completed", "trigger")]
    assert counts[("ci", "accepted")] == counts[("ci", "duplicate")] == 1
    (header,) = _headers(slack)
    assert header.text == HEADER
    assert [m.text for m in slack.thread("C1", header.ts)] == ["looked at 1 message(s)"]
    assert len(list(slack.live_messages())) == 2
    assert len(fake_llm.requests) == 1


async def test_the_rate_limit_is_one_count_for_both_workers(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    async with (
        FakeSlack() as slack,
        postgres_schema() as store_url,
        two_workers(tmp_path, fake_llm, slack, store_url, CI_TRIGGER + "rate_per_minute = 4\n") as (
            (a, _),
            urls,
        ),
    ):
        await within_one_minute()
        sent = [
            deliver(urls[n % 2], "ci", *signed(check_run(sha=f"s{n}"), delivery=f"d{n}"))
            for n in range(8)
        ]
        replies = await asyncio.gather(*sent)
        outcomes = sorted((r.status_code, r.json()["outcome"]) for r in replies)
        assert outcomes == [(202, "accepted")] * 4 + [(429, "rate_limited")] * 4
        for reply in replies:
            if reply.status_code == 429:
                assert 1 <= int(reply.headers["Retry-After"]) <= 60
        counts = await _counted(urls)
        assert (counts[("ci", "accepted")], counts[("ci", "rate_limited")]) == (4, 4)
        await a.until(lambda: len(_answers(slack)) >= 4, "four answers")
        runs = await _settled_runs(store_url, 4)
    assert len(runs) == 4


class HeldModel:
    """The fake LLM's responder: its first request waits until `release()` (the worker
    that asked is killed meanwhile); every request is answered as `_answer` does."""

    def __init__(self) -> None:
        self._released = asyncio.Event()
        self._first = True

    def release(self) -> None:
        self._released.set()

    async def __call__(self, request: RecordedRequest) -> Reply:
        if self._first:
            self._first = False
            await self._released.wait()
        return _answer(request)


@contextlib.contextmanager
def stalled(worker_: Parley) -> Iterator[None]:
    """`worker_` stalls (SIGSTOP: a pause, a noisy neighbour) and goes on (SIGCONT) after:
    meanwhile the other worker alone takes in and claims what comes."""
    worker_.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        worker_.proc.send_signal(signal.SIGCONT)


async def _checkpointed(store_url: str) -> RunRow:
    """Until the one run stored has its first checkpoint committed: the run."""
    async with await open_store(store_url) as store, asyncio.timeout(30):
        while True:
            runs = await store.runs(limit=10)
            if runs and await store.last_checkpoint(runs[0].id) is not None:
                return runs[0]
            await asyncio.sleep(0.02)


async def test_a_run_whose_worker_is_killed_while_it_waits_on_the_model_is_answered_by_the_other(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = model = HeldModel()
    body, headers = signed(check_run(), delivery="mid-run")
    async with (
        FakeSlack() as slack,
        postgres_schema() as store_url,
        two_workers(tmp_path, fake_llm, slack, store_url) as ((a, b), (a_url, b_url)),
    ):
        with stalled(b):
            reply = await deliver(a_url, "ci", body, headers)
            assert (reply.status_code, reply.json()["outcome"]) == (202, "accepted")
            run = await _checkpointed(store_url)  # begun on A, waiting on the model
            assert f":{a.proc.pid}:" in (run.worker or "")
            await a.kill()
            model.release()  # its answer goes to a dead worker
        await b.until(lambda: _answers(slack), "B's answer", timeout=30)
        again = await deliver(b_url, "ci", body, headers)
        assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
        (run,) = await _settled_runs(store_url, 1)

    assert run.state == "completed"
    assert f":{b.proc.pid}:" in (run.worker or "")
    (header,) = _headers(slack)
    assert header.text == HEADER
    assert [m.text for m in slack.thread("C1", header.ts)] == ["looked at 1 message(s)"]
    assert len(list(slack.live_messages())) == 2
    assert len(fake_llm.requests) == 2  # A's, never answered to it, and B's


async def test_a_delivery_acknowledged_by_a_worker_killed_right_after_is_run_by_the_other(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = _answer
    body, headers = signed(check_run(), delivery="orphaned")
    async with (
        FakeSlack() as slack,
        postgres_schema() as store_url,
        two_workers(tmp_path, fake_llm, slack, store_url) as ((a, b), (a_url, b_url)),
    ):
        # A takes the delivery in and claims its run; the run's first step, the header
        # post, is slow to reach Slack, and A dies before it does
        slack.delays["chat.postMessage"] = 2.0
        with stalled(b):
            reply = await deliver(a_url, "ci", body, headers)
            assert (reply.status_code, reply.json()["outcome"]) == (202, "accepted")
            on_its_way = await slack.wait_for(
                "chat.postMessage", where=lambda c: c.params.get("text") == HEADER
            )
            slack.fail_next("chat.postMessage", 500, where=lambda p: p is on_its_way[0].params)
            await a.kill()
        del slack.delays["chat.postMessage"]
        assert fake_llm.requests == []
        async with await open_store(store_url) as store:
            (run,) = await store.runs(limit=10)
        assert run.state == "running"  # claimed by A, not begun
        assert f":{a.proc.pid}:" in (run.worker or "")

        (run,) = await _settled_runs(store_url, 1)  # B's turn
        notices = [m.text for m in slack.live_messages() if "/resume" in m.text]
        assert (run.state, notices) == ("completed", [])
        await b.until(lambda: _answers(slack), "B's answer")
        again = await deliver(b_url, "ci", body, headers)
        assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")

    assert f":{b.proc.pid}:" in (run.worker or "")
    (header,) = _headers(slack)
    assert header.text == HEADER
    assert [m.text for m in slack.thread("C1", header.ts)] == ["looked at 1 message(s)"]
    assert len(list(slack.live_messages())) == 2
    assert len(fake_llm.requests) == 1
