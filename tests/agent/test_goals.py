"""Autonomous goals (docs/commands.md, `/goal create <text> --auto`): the supervisor's verdict, the
turn limit, stuck detection, a failing supervisor, and /stop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply

GOALS = {"autonomous_enabled": True, "autonomous_turn_delay_ms": 0, "verify_interval": 2}


def _is_supervisor(request: RecordedRequest) -> bool:
    last = request.json["messages"][-1]["content"]
    return isinstance(last, str) and last.startswith("You supervise")


def scripted(answers: Any, verdicts: Any) -> Any:
    """Work turns get `answers(n)`; supervisor calls get `verdicts(n)` (n counts from 1)."""
    counts = {"work": 0, "supervisor": 0}

    def respond(request: RecordedRequest) -> Reply:
        kind = "supervisor" if _is_supervisor(request) else "work"
        counts[kind] += 1
        make = verdicts if kind == "supervisor" else answers
        return make(counts[kind])

    return respond, counts


async def _run_goal(fake_llm: FakeLLM, tmp_path: Path, command: str, **goals: Any) -> Any:
    async with running_agent(fake_llm, tmp_path, goals={**GOALS, **goals}) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound(command), chat)
        lane = await agent.lane(("test", "c1", ""))
        assert lane.goal_task is not None
        await asyncio.wait_for(lane.goal_task, 20)
        return chat, lane.goal


async def test_goal_stops_when_the_supervisor_says_achieved(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    respond, counts = scripted(
        lambda n: Reply(text=f"step {n} done"),
        lambda n: Reply(text=f'{{"achieved": {str(n == 2).lower()}, "reason": "tests pass"}}'),
    )
    fake_llm.responder = respond
    chat, goal = await _run_goal(fake_llm, tmp_path, "/goal create fix the tests --auto")
    assert counts == {"work": 4, "supervisor": 2}  # verified after turns 2 and 4
    assert goal.state == "completed"
    assert chat.sent[-1] == "✅ Goal achieved after 4 turns: tests pass."
    assert chat.finals == ["step 1 done", "step 2 done", "step 3 done", "step 4 done"]


async def test_goal_stops_at_the_turn_limit(fake_llm: FakeLLM, tmp_path: Path) -> None:
    respond, counts = scripted(
        lambda n: Reply(text=f"step {n}"),
        lambda n: Reply(text='{"achieved": false, "reason": "not yet"}'),
    )
    fake_llm.responder = respond
    chat, goal = await _run_goal(fake_llm, tmp_path, "/goal create polish --auto --turns 3")
    assert counts["work"] == 3
    assert goal.state == "stopped"
    assert "turn limit reached (3 turns)" in chat.sent[-1]


async def test_goal_stops_when_stuck_repeating_itself(fake_llm: FakeLLM, tmp_path: Path) -> None:
    respond, counts = scripted(
        lambda n: Reply(text="I am trying." if n > 1 else "first"),
        lambda n: Reply(text='{"achieved": false, "reason": "no"}'),
    )
    fake_llm.responder = respond
    chat, goal = await _run_goal(
        fake_llm, tmp_path, "/goal create loop --auto --turns 20", max_stuck_count=3
    )
    assert counts["work"] == 4  # "first", then the same answer three times
    assert goal.state == "stuck"
    assert "the same answer 3 times in a row" in chat.sent[-1]


async def test_failing_supervisor_pauses_the_goal(fake_llm: FakeLLM, tmp_path: Path) -> None:
    respond, counts = scripted(
        lambda n: Reply(text=f"step {n}"), lambda n: Reply(text="I refuse to answer in JSON")
    )
    fake_llm.responder = respond
    chat, goal = await _run_goal(
        fake_llm, tmp_path, "/goal create x --auto --turns 50", max_supervisor_fails=2
    )
    assert counts == {"work": 4, "supervisor": 2}
    assert goal.state == "paused"
    assert "⏸ Goal paused" in chat.sent[-1]


async def test_stop_ends_an_autonomous_goal(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = lambda request: Reply(text="working " * 50, chunk_delay=0.02)
    async with running_agent(fake_llm, tmp_path, goals=GOALS) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("/goal create forever --auto"), chat)
        lane = await agent.lane(("test", "c1", ""))
        await fake_llm.wait_for_requests(1)
        await agent.submit(inbound("/stop"), chat)
        assert lane.goal_task is not None
        assert lane.goal_task.done()
        assert lane.goal is not None
        assert lane.goal.state == "stopped"
        assert any("stopped by /stop" in text for text in chat.sent)


async def test_the_supervisors_verdicts_are_priced_as_the_channels_calls(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Every LLM call is priced (docs/cost.md), the goal supervisor's too: its verdicts are
    recorded for the conversation and its channel, with no run and no asker."""
    respond, counts = scripted(
        lambda n: Reply(text=f"step {n} done", usage=(100, 10)),
        lambda n: Reply(text='{"achieved": true, "reason": "done"}', usage=(2_000, 20)),
    )
    fake_llm.responder = respond
    prices = {"fake-model": {"input": 100.0, "output": 1000.0}}  # USD per million tokens
    async with running_agent(fake_llm, tmp_path, goals=GOALS, prices=prices) as agent:
        await agent.submit(inbound("/goal create ship it --auto"), RecordingResponder())
        lane = await agent.lane(("test", "c1", ""))
        assert lane.goal_task is not None
        await asyncio.wait_for(lane.goal_task, 20)
        await agent.store.flush()
        calls = await agent.store.llm_calls(0.0)
    assert counts == {"work": 2, "supervisor": 1}
    [verdict] = [c for c in calls if c.run_id == ""]
    assert (verdict.conv, verdict.channel, verdict.user_id) == ("test:c1:", "test:c1", "")
    assert (verdict.input_tokens, verdict.output_tokens) == (2_000, 20)
    assert verdict.cost == 2_000 * 100e-6 + 20 * 1000e-6
    assert len([c for c in calls if c.run_id]) == 2  # the two work turns
