"""Autonomous goals (docs/commands.md, `/goal create <text> --auto [--turns N]`).

Each of the driver's turns is a queued run of the conversation, claimed like a message by
the dispatcher (`core.agent.dispatcher`; with several workers, by whichever is free), so
it never runs beside another run of the conversation and keeps its place in their order
(messages queued before it go first). The driver waits `autonomous_turn_delay_ms` between
turns, and every `verify_interval` turns asks a supervisor model for a JSON verdict
`{"achieved": bool, "reason": str}`. It stops when the supervisor says achieved, at the
turn limit, after `max_stuck_count` identical answers in a row, or on `/stop`; a
supervisor that keeps failing pauses the goal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import replace
from typing import Protocol

from core.agent.dispatcher import Dispatcher, Queued
from core.agent.lane import Lane, LaneHost, RunReport
from core.agent.turn import new_run_id
from core.chat import Inbound, Responder
from core.cost.meter import RunMeter, Who
from core.errors import BudgetExceeded, StoreError
from core.events import Usage, discard
from core.messages import Message
from core.providers.base import Provider
from core.store import GoalRow

log = logging.getLogger(__name__)

FIRST_PROMPT = (
    "[Autonomous goal] Work toward this goal on your own, using tools as needed: {goal}\n"
    "Each of your answers ends one step; you will be asked to continue."
)
NEXT_PROMPT = (
    "[Autonomous goal] Continue working toward the goal: {goal}\n"
    "Take the next concrete step. If it is fully achieved, say so and summarise the result."
)
SUPERVISOR_PROMPT = """You supervise an assistant working toward a goal without a human.
Goal: {goal}

The assistant's latest answers (newest last):
{answers}

Is the goal fully achieved? Reply with JSON only: {{"achieved": true|false, "reason": "…"}}"""


async def ask_supervisor(
    provider: Provider, goal: str, answers: list[str], meter: RunMeter | None = None
) -> tuple[bool, str]:
    """One tool-less call, priced and held to the budgets by `meter` (docs/cost.md);
    raises ValueError if the reply is not the JSON verdict, `BudgetExceeded` if a budget
    refuses the call."""
    body = "\n---\n".join(a[-1500:] for a in answers[-3:]) or "(none yet)"
    prompt = SUPERVISOR_PROMPT.format(goal=goal, answers=body)
    text = await _complete(provider, prompt, meter)
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match is None:
        raise ValueError(f"supervisor reply is not JSON: {text[:200]!r}")
    verdict = json.loads(match.group(0))
    if not isinstance(verdict, dict) or not isinstance(verdict.get("achieved"), bool):
        raise ValueError(f"supervisor verdict lacks a boolean `achieved`: {verdict!r}")
    return verdict["achieved"], str(verdict.get("reason", ""))


async def _complete(provider: Provider, prompt: str, meter: RunMeter | None) -> str:
    if meter is None:
        return (await provider.complete([Message.user(prompt)])).message.content
    kind, model = provider.settings.kind, provider.model
    # worst case: about 3 characters a token, and the most the model may answer
    worst_prompt = len(prompt) // 3 + 1
    held = await meter.reserve(kind, model, worst_prompt, provider.settings.max_output_tokens)
    usage: Usage | None = None
    try:
        done = await provider.complete([Message.user(prompt)])
        text = done.message.content
        usage = done.usage or Usage(len(prompt) // 4 + 1, len(text) // 4 + 1, estimated=True)
        return text
    finally:
        meter.settle(held, provider.name, kind, model, usage)


class GoalHost(LaneHost, Protocol):
    """What the goal driver needs of the agent."""

    @property
    def dispatcher(self) -> Dispatcher:
        """Where the goal's turns queue."""
        ...


async def drive_goal(agent: GoalHost, lane: Lane, responder: Responder) -> None:
    settings = agent.goal_settings
    goal = lane.goal
    if goal is None:
        return
    supervisor_name = settings.supervisor_provider or lane.provider_name
    supervisor = agent.factory.provider(supervisor_name or agent.factory.default_provider)
    platform, channel_id, _ = lane.key  # the verdicts are the channel's calls (no asker)
    who = Who("", lane.conv_id, "", f"{platform}:{channel_id}", "")
    meter = agent.ledger.for_run(who, discard)  # a refusal is audited by the ledger
    answers: list[str] = []
    fails = 0
    state, note = "active", ""
    try:
        while True:
            if goal.turns >= goal.max_turns:
                state, note = "stopped", f"turn limit reached ({goal.max_turns} turns)"
                break
            prompt = (FIRST_PROMPT if goal.turns == 0 else NEXT_PROMPT).format(goal=goal.text)
            report = await _turn(agent, lane, responder, prompt)
            goal = replace(goal, turns=goal.turns + 1)
            lane.set_goal(goal)
            await agent.store.save_goal(goal, lane.conv_id)
            if report is None or report.state in ("cancelled", "failed"):
                state, note = "stopped", "the run was stopped or failed"
                break
            answers.append(report.text.strip())
            tail = answers[-settings.max_stuck_count :]
            if len(tail) == settings.max_stuck_count and len(set(tail)) == 1:
                state, note = "stuck", f"the same answer {settings.max_stuck_count} times in a row"
                break
            if goal.turns % settings.verify_interval == 0:
                try:
                    achieved, reason = await ask_supervisor(supervisor, goal.text, answers, meter)
                    fails = 0
                except BudgetExceeded as exc:  # the refusal says which budget and when
                    state, note = "paused", str(exc)
                    break
                except Exception as exc:  # a failing supervisor is asked again later
                    fails += 1
                    log.warning("goal supervisor failed (%d): %s", fails, exc)
                    agent.events.emit(
                        "agent.goal.supervisor_failed", {"fails": fails}, conv=lane.conv_id
                    )
                    if fails >= settings.max_supervisor_fails:
                        state, note = "paused", f"the supervisor failed {fails} times"
                        break
                else:
                    agent.events.emit(
                        "agent.goal.verdict", {"achieved": achieved}, conv=lane.conv_id
                    )
                    if achieved:
                        state, note = "completed", reason or "the supervisor confirmed it"
                        break
            await agent.clock.sleep(settings.autonomous_turn_delay_ms / 1000)
    except asyncio.CancelledError:
        state, note = "stopped", "Parley is restarting" if agent.closing else "stopped by /stop"
        await _finish(agent, lane, responder, goal, state, note)
        raise
    await _finish(agent, lane, responder, goal, state, note)


async def _turn(agent: GoalHost, lane: Lane, responder: Responder, prompt: str) -> RunReport | None:
    """One turn of the goal: queued like a message and run when the dispatcher (here or on
    another worker) claims it. A driver stopped while its turn still waits takes the turn
    out of the queue; a turn already claimed runs to its end (`/stop` reaches it wherever
    it runs)."""
    queue = agent.dispatcher
    if agent.closing:
        return None
    inbound = Inbound(*lane.key, user_id="", user_name="", text=prompt)
    done: asyncio.Future[RunReport] = asyncio.get_running_loop().create_future()
    queued = Queued(inbound, responder, new_run_id(), done)
    try:
        await queue.enqueue(queued, trigger="goal")
        return await done
    except StoreError as exc:
        log.warning("goal turn of %s not queued: %s", lane.conv_id, exc)
        return RunReport(queued.run_id, "failed", "", stop_reason="failed", failure=str(exc))
    except asyncio.CancelledError:  # also while being queued: its insert may be committed
        with contextlib.suppress(StoreError):
            await queue.withdraw(queued, "the goal stopped")
        raise


async def _finish(
    agent: GoalHost, lane: Lane, responder: Responder, goal: GoalRow, state: str, note: str
) -> None:
    final = replace(goal, state=state, note=note)
    if lane.goal is not None and lane.goal.text == goal.text:  # not replaced or cleared
        lane.set_goal(final)
        await agent.store.save_goal(final, lane.conv_id)
    agent.events.emit(
        "agent.goal.ended", {"state": state, "turns": goal.turns, "note": note}, conv=lane.conv_id
    )
    labels = {"completed": "✅ Goal achieved", "paused": "⏸ Goal paused"}
    label = labels.get(state, "⏹ Goal stopped")
    with contextlib.suppress(Exception):
        await responder.send(f"{label} after {goal.turns} turns: {note}.")
