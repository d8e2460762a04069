"""The runs of scheduled jobs: each fire runs in a lane of its own, pinned to the
conversation the job builds (its policy and limits), with nobody to stream to; the
scheduler (`bot.jobs`) posts what it came to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext

from core.agent.agent import Agent
from core.agent.conversation import Conversation
from core.agent.journal import JournalBox
from core.agent.lane import RunReport
from core.agent.responders import QuietResponder
from core.agent.runs import resume_risk
from core.chat import ConversationKey
from core.fence import HELD, Fence

Build = Callable[[JournalBox], Conversation]


async def run_job(
    agent: Agent, key: ConversationKey, prompt: str, build: Build, provider_name: str
) -> RunReport:
    """A cron run: `prompt` in a fresh lane pinned to the conversation `build` makes with
    the lane's journal; the lane is dropped after."""
    if agent.workers is not None:
        await agent.workers.start()  # its run is this worker's: others notice if it dies
    lane = await agent.lane(key, build=False)  # the job pins its own conversation
    try:
        lane.pin(build(lane.journal), provider_name)
        report = await agent.run_in_lane(lane, QuietResponder(), user_text=prompt, trigger="cron")
    finally:
        agent.drop_lane(key)
    return report or RunReport("", "cancelled", "", stop_reason="closing")


async def resume_job(
    agent: Agent, key: ConversationKey, run_id: str, build: Build, provider_name: str
) -> RunReport:
    """A cron run interrupted by its worker's death goes on where it stopped, in a lane
    pinned to the conversation `build` makes, with the run's history — if that is safe;
    else its report says why not (`stop_reason` "unsafe", `failure` the reason) and the
    run ends interrupted."""
    store = agent.store
    lane = await agent.lane(key, build=False)
    try:
        conversation = build(lane.journal)
        conversation.messages = await store.load_messages(lane.conv_id)
        lane.pin(conversation, provider_name)
        why = await resume_risk(store, run_id, conversation, same_prompt=False)
        if why is not None:
            store.set_run_state(run_id, "timed_out", "interrupted", resumable=False)
            await store.flush()
            return RunReport(run_id, "timed_out", "", stop_reason="unsafe", failure=why)
        report = await agent.run_in_lane(
            lane, QuietResponder(), user_text=None, trigger="cron", run_id=run_id, resume=True
        )
    finally:
        agent.drop_lane(key)
    return report or RunReport(run_id, "cancelled", "", stop_reason="closing")


def holding_fire(
    agent: Agent, key: str, still_mine: Callable[[], Awaitable[bool]]
) -> AbstractContextManager[Fence]:
    """The fence of a scheduled fire this worker runs (`core.fence`): its post goes out
    only while the fire is still this worker's."""
    if agent.workers is None:
        return nullcontext(HELD)
    return agent.workers.liveness.holding(key, still_mine)


__all__ = ["holding_fire", "resume_job", "run_job"]
