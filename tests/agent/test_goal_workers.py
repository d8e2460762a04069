"""Autonomous goals with several workers on one PostgreSQL store (docs/commands.md,
docs/scale-out.md): a goal's
turns queue like messages, so a message taken in by another worker never runs beside a
goal turn and keeps its place in the order; `/stop` and `/goal clear` reach the goal
wherever its turn is. The harness is tests/agent/test_workers.py's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.agent import Agent
from core.store import RunRow
from tests.agent.test_workers import Platform, last_user_text, until, user_texts, workers
from tests.agentkit import inbound
from tests.fakes.clock import ManualClock
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.store.conftest import postgres_schema

KEY = ("test", "c1", "")
GOALS = {"autonomous_enabled": True, "autonomous_turn_delay_ms": 0, "verify_interval": 100}
GOAL_PROMPT = "[Autonomous goal]"


class Gated:
    """The fake LLM's answers: goal turns answer `step N` (N: the goal prompts in the
    history), messages `re: TEXT`; a gated text waits for its gate to open."""

    def __init__(self, *gated: str) -> None:
        self.gates = {text: asyncio.Event() for text in gated}

    async def __call__(self, request: RecordedRequest) -> Reply:
        text = last_user_text(request)
        turn = sum(t.startswith(GOAL_PROMPT) for t in user_texts(request))
        name = f"step {turn}" if text.startswith(GOAL_PROMPT) else text
        if name in self.gates:
            await self.gates[name].wait()
        return Reply(text=name if text.startswith(GOAL_PROMPT) else f"re: {text}")


@contextlib.asynccontextmanager
async def goal_workers(
    fake_llm: FakeLLM, tmp_path: Path, gated: str, **goals: object
) -> AsyncIterator[tuple[Gated, Platform, Agent, Agent]]:
    """Two workers on a schema of their own with autonomous goals on (`goals` changes
    GOALS), the fake LLM answering with `Gated(gated)`: the answers, the platform, the
    worker a test drives the goal from and the other one."""
    answers = Gated(gated)
    fake_llm.responder = answers
    platform = Platform()
    settings = {**GOALS, **goals}
    async with (
        postgres_schema() as url,
        workers(fake_llm, tmp_path, url, platform, 2, goals=settings) as (driver, other),
    ):
        assert driver.workers is not None
        assert other.workers is not None
        yield answers, platform, driver, other


async def runs_of(agent: Agent) -> list[RunRow]:
    """The conversation's runs, first stored first."""
    return sorted(await agent.store.runs(conv="test:c1:", limit=100), key=lambda r: r.seq)


def assert_one_at_a_time(runs: list[RunRow]) -> None:
    ordered = sorted(runs, key=lambda r: r.started_at or 0.0)
    for before, after in itertools.pairwise(ordered):
        assert before.ended_at is not None
        assert after.started_at is not None
        assert before.ended_at <= after.started_at, f"{before.id} and {after.id} overlapped"


@pytest.mark.parametrize("claimers", ["other", "both"])
async def test_a_message_taken_in_elsewhere_during_a_goal_turn_runs_after_it_alone(
    fake_llm: FakeLLM, tmp_path: Path, claimers: str
) -> None:
    async with goal_workers(fake_llm, tmp_path, "step 1") as (
        answers,
        platform,
        driver,
        other,
    ):
        if claimers == "other":
            driver.workers.stop_claiming()  # the goal's turns run on the other worker
        end = platform(KEY)
        await driver.submit(inbound("/goal create write it --auto --turns 3"), end)
        await fake_llm.wait_for_requests(1)
        await other.submit(inbound("hello"), end)  # taken in while goal turn 1 runs
        answers.gates["step 1"].set()
        lane = driver.lanes[KEY]
        assert lane.goal_task is not None
        await asyncio.wait_for(lane.goal_task, 30)
        assert end.finals == ["step 1", "re: hello", "step 2", "step 3"]
        assert "turn limit reached (3 turns)" in end.sent[-1]
        runs = await runs_of(driver)
        assert [(r.trigger, r.state) for r in runs] == [
            ("goal", "completed"),
            ("user", "completed"),
            ("goal", "completed"),
            ("goal", "completed"),
        ]
        if claimers == "other":
            assert {r.worker for r in runs} == {other.workers.id}
        assert_one_at_a_time(runs)
        history = await driver.store.load_messages("test:c1:")
        users = [m.content for m in history if m.role == "user"]
        assert [u if u == "hello" else u[:17] for u in users] == [
            GOAL_PROMPT,
            "hello",
            GOAL_PROMPT,
            GOAL_PROMPT,
        ]


async def test_a_goal_s_next_turn_waits_for_a_message_that_came_between_its_turns(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with goal_workers(fake_llm, tmp_path, "hello", autonomous_turn_delay_ms=1000) as (
        answers,
        platform,
        driver,
        other,
    ):
        driver.workers.stop_claiming()  # hello and the goal's turns run on the other worker
        clock = driver.clock = ManualClock()  # the delay between turns, stepped by hand
        end = platform(KEY)
        await driver.submit(inbound("/goal create write it --auto --turns 2"), end)
        await until(lambda: end.finals == ["step 1"] and bool(clock.wake_times()))
        await other.submit(inbound("hello"), end)
        await fake_llm.wait_for_requests(2)  # hello runs (held)
        clock.advance(1.0)  # the driver's next turn
        async with asyncio.timeout(20):
            while len(runs := await runs_of(driver)) < 3:
                await asyncio.sleep(0.02)
        assert [(r.trigger, r.state) for r in runs] == [
            ("goal", "completed"),
            ("user", "running"),
            ("goal", "queued"),  # behind hello, not beside it
        ]
        answers.gates["hello"].set()
        await until(lambda: len(end.finals) == 3 and bool(clock.wake_times()))
        assert end.finals == ["step 1", "re: hello", "step 2"]
        clock.advance(1.0)  # then the turn limit
        lane = driver.lanes[KEY]
        assert lane.goal_task is not None
        await asyncio.wait_for(lane.goal_task, 30)
        assert_one_at_a_time(await runs_of(driver))


async def test_a_stop_on_the_worker_running_the_goal_s_turn_stops_the_goal(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with goal_workers(fake_llm, tmp_path, "step 1") as (
        answers,
        platform,
        driver,
        other,
    ):
        driver.workers.stop_claiming()  # the goal's turns run on the other worker
        end = platform(KEY)
        await driver.submit(inbound("/goal create write it --auto"), end)
        await fake_llm.wait_for_requests(1)
        await until(lambda: other.lanes.get(KEY) is not None and other.lanes[KEY].busy)
        await other.submit(inbound("/stop"), end)
        lane = driver.lanes[KEY]
        assert lane.goal_task is not None
        await asyncio.wait_for(asyncio.wait({lane.goal_task}), 20)
        assert lane.goal is not None
        assert (lane.goal.state, lane.goal.note) == ("stopped", "stopped by /stop")
        assert any("Goal stopped after" in s and "stopped by /stop" in s for s in end.sent)
        assert [(r.trigger, r.state) for r in await runs_of(driver)] == [("goal", "cancelled")]
        answers.gates["step 1"].set()
        assert len(fake_llm.requests) == 1


async def test_a_goal_cleared_while_its_turn_waits_takes_the_turn_out_of_the_queue(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with goal_workers(fake_llm, tmp_path, "hello") as (
        answers,
        platform,
        driver,
        other,
    ):
        driver.workers.stop_claiming()  # hello runs on the other worker: none here
        end = platform(KEY)
        await other.submit(inbound("hello"), end)
        await fake_llm.wait_for_requests(1)
        await driver.submit(inbound("/goal create write it --auto"), end)
        async with asyncio.timeout(20):
            while len(await runs_of(driver)) < 2:
                await asyncio.sleep(0.02)
        await driver.submit(inbound("/goal clear"), end)
        answers.gates["hello"].set()
        await until(lambda: end.finals == ["re: hello"])
        runs = await runs_of(driver)
        assert [(r.trigger, r.state, r.reason) for r in runs][1] == (
            "goal",
            "cancelled",
            "the goal stopped",
        )
        assert len(fake_llm.requests) == 1


async def test_a_goal_goes_on_when_the_worker_running_its_turn_dies(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with goal_workers(fake_llm, tmp_path, "step 1") as (
        answers,
        platform,
        driver,
        other,
    ):
        driver.workers.stop_claiming()  # the goal's turn runs on the other worker
        end = platform(KEY)
        await driver.submit(inbound("/goal create write it --auto --turns 1"), end)
        await fake_llm.wait_for_requests(1)
        await other.workers.close()  # silent from now on: the driver's worker takes over
        await fake_llm.wait_for_requests(2, timeout=20)  # ... and goes on with the turn
        answers.gates["step 1"].set()
        lane = driver.lanes[KEY]
        assert lane.goal_task is not None
        await asyncio.wait_for(asyncio.wait({lane.goal_task}), 20)
        assert lane.goal is not None
        assert lane.goal.turns == 1
        [run] = await runs_of(driver)
        assert (run.state, run.worker) == ("completed", driver.workers.id)
        assert end.finals.count("step 1") == 1  # the silent worker's answer was not posted
