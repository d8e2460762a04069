"""Going on with an interrupted run (docs/durability.md#resume): `/resume`, `/skip`, and
`resume_run`, which start-up recovery (`core.agent.recovery`) uses too.

A run that timed out or waits on a human goes on from its last checkpoint unless going on
could repeat a side effect (`core.agent.runs.resume_blocker`): then it stops in
`waiting_on_human` and says why, or, when the person who sends `/resume` decides so, goes
on anyway. Either way the run is first taken through the store
(`Dispatcher.take_resumable`), so that nothing else of its conversation runs meanwhile and
no other worker goes on with it too.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Protocol

from core.agent.dispatcher import Dispatcher
from core.agent.lane import Lane, RunReport
from core.agent.runs import resume_blocker
from core.agent.takeover import TakeoverHost
from core.chat import Responder
from core.messages import Message
from core.store import RunRow, Store


class ResumeHost(TakeoverHost, Protocol):
    """What resuming needs of the agent: what going on with a run taken over needs, and the
    store's queue to take the run through."""

    dispatcher: Dispatcher


async def interrupted_run(store: Store, lane: Lane) -> RunRow | None:
    """The lane's latest interrupted run that may go on (`/resume`, `/skip`), if any."""
    stopped = ["timed_out", "waiting_on_human"]
    candidates = await store.runs(conv=lane.conv_id, states=stopped, limit=5)
    return next((r for r in candidates if r.resumable), None)


async def resume(host: ResumeHost, lane: Lane, responder: Responder) -> str | None:
    """Continue the lane's interrupted run; returns a message for the user if it cannot.
    A paused run (one a takeover found unsafe to go on with by itself) goes on anyway:
    the person who sends `/resume` decides so."""
    run = await interrupted_run(host.store, lane)
    if run is None:
        return "There is no interrupted run to resume here."
    paused = run.state == "waiting_on_human"
    return await resume_run(host, lane, responder, run.id, anyway=paused)


async def skip(host: ResumeHost, lane: Lane) -> str:
    """`/skip`: drop the lane's interrupted run, so that the messages behind it go on."""
    run = await interrupted_run(host.store, lane)
    if run is None:
        return "There is no interrupted run to skip here."
    if why := await host.dispatcher.take_resumable(lane, run.id):
        return why  # taken first: a /resume elsewhere and this cannot both have it
    host.store.set_run_state(run.id, "cancelled", "skipped", resumable=False)
    host.events.emit("agent_run.skipped", {}, run_id=run.id, conv=lane.conv_id)
    await host.store.flush()
    host.dispatcher.run_ended(lane, run.id)  # what waited behind it goes now
    return f"Skipped the interrupted run {run.id}; I go on with what came after it."


async def resume_run(
    host: ResumeHost,
    lane: Lane,
    responder: Responder,
    run_id: str,
    *,
    anyway: bool = False,
    since: float = 0.0,
) -> str | None:
    """Continue run `run_id` in the lane, or say why it cannot safely go on. With
    `anyway`, it goes on all the same: a call that started and never finished is not
    run again, and the model is told it may or may not have taken effect. Queued runs
    created before `since` do not hold it (`Dispatcher.take_resumable`)."""
    store, events, dispatcher = host.store, host.events, host.dispatcher
    if why := await dispatcher.take_resumable(lane, run_id, since):
        return why
    conversation = await host.conversation_of(lane)
    why = await resume_blocker(store, run_id, conversation)
    if why is not None and anyway:
        store.save_messages(lane.conv_id, conversation.messages)
        data = {"why": "anyway", "risk": why}
        events.emit("agent_run.resumed", data, run_id=run_id, conv=lane.conv_id)
    elif why is not None:
        text = (
            f"I can't safely resume run {run_id}: {why}. Please check what happened and "
            "tell me how to go on."
        )
        conversation.messages.append(Message.assistant(text))
        store.save_messages(lane.conv_id, conversation.messages)
        store.set_run_state(run_id, "waiting_on_human", "unsafe", resumable=False)
        events.emit("agent_run.resume_unsafe", {"why": why}, run_id=run_id, conv=lane.conv_id)
        lane.settled("waiting_on_human")
        await store.flush()
        dispatcher.run_ended(lane, None)  # what waited behind it goes now
        return text
    resumed = host.run_in_lane(
        lane, responder, user_text=None, trigger="resume", run_id=run_id, resume=True
    )
    lane.work(dispatcher.spawn_run(run_id, _ended(resumed), f"resume {lane.conv_id}"))
    return None


async def _ended(run: Coroutine[Any, Any, RunReport | None]) -> None:
    await run


__all__ = ["ResumeHost", "interrupted_run", "resume", "resume_run", "skip"]
