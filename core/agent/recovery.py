"""Start-up recovery (docs/durability.md): what a crash or a restart left behind.

Runs an earlier process left `running` become `timed_out`; those with a checkpoint are
announced in their conversation with a `/resume` hint, after the half-streamed preview a
crash left is retracted; runs that were waiting on an approver go on at once; messages that
were still queued stay queued, and the dispatcher (`core.agent.dispatcher`) claims them
once this is done; tool process groups that outlived their process die.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from core.agent.conversation import Conversation
from core.agent.lane import Lane
from core.agent.responders import safe_send
from core.agent.runs import reconcile_runs, reopen_calls
from core.chat import ConversationKey, Responder, previews
from core.eventlog import EventLog
from core.sandbox import kill_leftovers
from core.store import ApprovalRow, RunRow, SharedStore, Store

PREVIEW_RETRACTED = "(interrupted by a restart — the answer continues below)"


def parse_conv(conv: str) -> ConversationKey:
    """`slack:C0123:1700000000.0001` → ("slack", "C0123", "1700000000.0001")."""
    channel, channel_id, thread = [*conv.split(":", 2), "", ""][:3]
    return (channel, channel_id, thread)


class RecoveryHost(Protocol):
    """What recovery needs of the agent."""

    store: Store
    events: EventLog
    started_at: float

    async def responder_for(self, key: ConversationKey) -> Responder | None: ...

    async def lane(self, key: ConversationKey) -> Lane: ...

    async def conversation_of(self, lane: Lane) -> Conversation: ...

    async def resume_run(
        self, lane: Lane, responder: Responder, run_id: str, *, since: float = 0.0
    ) -> str | None: ...


async def reconcile(host: RecoveryHost) -> list[str]:
    """At start-up: runs left `running` by a crash become `timed_out`; those with a
    checkpoint to go on from are announced in their conversation with a /resume hint,
    except runs that were waiting on an approver: they go on at once, waiting again
    on the same request (its prompt, its deadline)."""
    # Only runs of earlier processes: channels may already be delivering new messages.
    interrupted = await reconcile_runs(host.store, host.events, before=host.started_at)
    killed = kill_leftovers(await host.store.take_tool_groups())
    if killed:
        host.events.emit("agent.tool_groups_killed", {"count": killed})
    pending = await host.store.pending_approvals(before=host.started_at)
    waiting = await resume_waiting(host, pending)
    host.store.expire_approvals(a.id for a in pending if a.run_id not in waiting)
    await announce_interrupted(host, [run for run in interrupted if run.id not in waiting])
    await deliver_owed(host, None, None, host.started_at)
    for run in reversed(await host.store.runs(states=["queued"], limit=10_000)):
        if run.created_at < host.started_at:  # the dispatcher claims it next
            host.events.emit("agent_run.requeued", {}, run_id=run.id, conv=run.conv)
    await host.store.flush()
    return [run.id for run in interrupted]


async def take_over(
    host: RecoveryHost,
    worker_id: str,
    dead: str | None,
    created_before: float,
    publish: Callable[[str, str], None],
    silent_for: float | None = None,
) -> list[RunRow]:
    """Several workers (`core.agent.workers`): the runs worker `dead` left running become
    `worker_id`'s — if `dead` is still silent for `silent_for` seconds, when given — and
    the answers it owed are posted. A message whose turn never got going is queued again
    (and announced with `publish`); a child run waits for its parent to resume it. Returns
    the runs `worker_id` is to go on with (`core.agent.takeover`): still `running`, so
    that nothing of their conversations overtakes them. A run without a checkpoint has
    posted nothing: its first post waits until its start is committed (`core.agent.turn`),
    so one killed after a preview is gone on with here, never answered twice."""
    store, events = host.store, host.events
    assert isinstance(store, SharedStore)  # several workers (`core.agent.workers`) only
    taken = await store.take_over_runs(
        dead, worker_id, created_before=created_before, silent_for=silent_for
    )
    for conv in await deliver_owed(host, dead, worker_id, created_before):
        publish("queued", conv)  # its next run may go now: the answer before it is out
    go_on: list[RunRow] = []
    for run in taken:
        if run.state == "queued":  # it never got going: any worker answers it afresh
            events.emit("agent_run.requeued", {"worker": dead}, run_id=run.id, conv=run.conv)
            publish("queued", run.conv)
            continue
        data = {"resumable": run.resumable, "worker": dead}
        events.emit("agent_run.reconcile", data, run_id=run.id, conv=run.conv)
        if run.state == "running":
            go_on.append(run)
    await store.flush()
    return go_on


async def announce_interrupted(host: RecoveryHost, interrupted: list[RunRow]) -> None:
    """Tell each run's conversation that it was interrupted and `/resume` goes on, after
    retracting the half-streamed preview it left."""
    for run in interrupted:
        if run.parent_run_id is not None:
            continue  # a child run goes on when its parent is resumed (core.agent.children)
        responder = await host.responder_for(parse_conv(run.conv))
        if responder is not None:
            await retract_previews(host.store, run.id, responder)
            await safe_send(
                responder,
                f"I was interrupted while working on your last request (run {run.id}). "
                "Send /resume to continue where I stopped.",
            )


async def deliver_owed(
    host: RecoveryHost, dead: str | None, worker_id: str | None, created_before: float
) -> list[str]:
    """Post the answers runs of `dead` (None: of no worker) finished but never saw taken
    by the platform, below their retracted preview; each is then no longer owed. Returns
    their conversations."""
    owed = await host.store.take_owed_replies(dead, worker_id, created_before=created_before)
    for reply in owed:
        responder = await host.responder_for(parse_conv(reply.conv))
        if responder is not None:
            await retract_previews(host.store, reply.run_id, responder)
            await safe_send(responder, reply.text)
            host.events.emit("channel.reply.redelivered", {}, run_id=reply.run_id, conv=reply.conv)
        await host.store.reply_delivered(reply.run_id)
    return [reply.conv for reply in owed]


async def resume_waiting(host: RecoveryHost, pending: list[ApprovalRow]) -> set[str]:
    """Resume the interrupted runs that were waiting on the `pending` requests; returns
    their ids. A run that cannot safely go on says why in its conversation."""
    calls: dict[str, set[str]] = {}
    for approval in pending:
        if approval.run_id and approval.call_id:
            calls.setdefault(approval.run_id, set()).add(approval.call_id)
    resumed: set[str] = set()
    for run_id, call_ids in calls.items():
        run = await host.store.run(run_id)
        if run is None or run.state != "timed_out" or not run.resumable:
            continue
        recent = await host.store.runs(conv=run.conv, limit=10)
        if next((r.id for r in recent if r.state != "queued"), None) != run.id:
            continue  # a later run superseded it (new input before this start-up)
        key = parse_conv(run.conv)
        responder = await host.responder_for(key)
        lane = await host.lane(key)
        later = await host.store.runs(conv=run.conv, states=["queued"], limit=10)
        if responder is None or lane.working or any(r.created_at >= host.started_at for r in later):
            continue  # nobody to ask, or new input came first: it supersedes the run
        lane.answer_to(responder)
        conversation = await host.conversation_of(lane)
        if reopen_calls(conversation.messages, call_ids):  # a shutdown closed them
            host.store.save_messages(lane.conv_id, conversation.messages)
        why = await host.resume_run(lane, responder, run.id, since=host.started_at)
        if why is not None:
            await safe_send(responder, why)
            continue
        host.events.emit("agent_run.resumed", {"why": "approval"}, run_id=run.id, conv=run.conv)
        resumed.add(run.id)
    return resumed


async def retract_previews(store: Store, run_id: str, responder: Responder) -> None:
    """The half-streamed answer a crash left in the chat would read like a second,
    unfinished reply: edit it to say the answer continues below."""
    posted = [
        str(data.get("message_id"))
        for _at, name, _iteration, data in await store.events(run_id)
        if name == "channel.preview.posted"
    ]
    if not posted:
        return
    stream = responder.stream()
    if previews(stream):  # channels that edit their messages
        await stream.retract(posted, PREVIEW_RETRACTED)


__all__ = [
    "PREVIEW_RETRACTED",
    "RecoveryHost",
    "announce_interrupted",
    "deliver_owed",
    "parse_conv",
    "reconcile",
    "resume_waiting",
    "retract_previews",
    "take_over",
]
