"""Approval requests that outlive the process (docs/tools.md#approvals).

An admin tool call asks the approvers through its conversation's `Responder`. The request
is committed to the store first — its run and tool call id, what is asked and its
deadline — and so, once posted, is where its prompt is. After a restart (a crash or a
deploy):

- the run that was waiting is resumed at start-up (`Agent.reconcile`), and its
  authorisation step takes the stored request up again: no new prompt, and only the time
  left until the original deadline;
- a click on the old prompt answers it: once the run waits again the channel's own pending
  requests have it; before that, `ApprovalDesk.answer` stores the approver's answer for the
  run to find.

A call waiting on an approver is not recorded as started (see `ToolExecutor.execute`): it
has run nothing, so resuming its run is always safe.

A durable grant (an approver's "always", core/agent/grants.py) answers a request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from core import metrics, tracing
from core.agent.grants import grant_keys, new_grant
from core.agent.lane import Lane
from core.audit import AuditLog
from core.chat import ApprovalRequest, GrantScope, PromptRef, Responder
from core.errors import StoreError
from core.eventlog import EventLog
from core.fence import current as current_fence
from core.messages import ToolCall
from core.records import record
from core.store import ApprovalRow, GrantRow, Store
from core.store.notify import Notices

log = logging.getLogger(__name__)


@record(slots=True)
class _Record:
    """`core.chat.ApprovalRecord` of one stored request."""

    store: Store
    approval_id: str
    closing: Callable[[], bool]
    events: EventLog
    conv: str
    run_id: str | None
    tool: str
    audit: AuditLog | None = None
    elsewhere: bool = False  # answered through another worker, which settles the prompt
    answered_by: str = ""  # who answered, as the channel names them ("timeout": nobody)

    def posted(self, prompt: PromptRef) -> None:
        self.store.approval_posted(self.approval_id, prompt)

    def granted(self, scope: GrantScope, by: str) -> None:
        grant = new_grant(self.conv, self.tool, scope, by)
        self.store.add_grant(grant)
        data = {"tool": self.tool, "scope": scope, "key": grant.key, "by": by}
        self.events.emit("agent.grant.added", data, run_id=self.run_id, conv=self.conv)
        if self.audit is not None:
            self.audit.record("grant.added", by, {**data, "grant": grant.id}, conv=self.conv)

    def answered(self, allowed: bool, by: str) -> None:
        self.answered_by = by or "timeout"  # the desk records the outcome with it

    def outlives_cancellation(self) -> bool:
        return self.closing() or self.elsewhere or _lost()


def _asker_of(run_id: str | None) -> str:
    """Who asks for an approval: the run (its sender is in its events)."""
    return f"run:{run_id}" if run_id else "parley"


def _lost() -> bool:
    """The run asking was taken over by another worker (`core.fence`): its request is the
    other worker's now, prompt and all."""
    fence = current_fence()
    return fence is not None and fence.lost


class ApprovalDesk:
    """The agent's approval requests: asked, taken up again after a restart, answered."""

    def __init__(
        self,
        store: Store,
        events: EventLog,
        closing: Callable[[], bool],
        audit: AuditLog | None = None,
    ) -> None:
        self.store, self.events, self.audit = store, events, audit
        self._closing = closing
        # Held while a request is looked up and claimed, so that an answer arriving through
        # the store and a run taking the request up again never miss each other.
        self._lock = asyncio.Lock()
        self._waiting: set[str] = set()  # requests a run of this process waits on
        self.held: set[str] = set()  # runs whose request a shutdown left pending
        # Several workers (`core.agent.workers`): an answer stored by another worker is
        # announced, and wakes the run waiting here.
        self.notices: Notices | None = None
        self._answers: dict[str, asyncio.Future[str]] = {}

    async def ask(
        self,
        responder: Responder,
        conv: str,
        run_id: str | None,
        call: ToolCall,
        summary: str,
        reason: str,
        answer_within: float,
        *,
        grantable: bool = False,
        asker: str = "",
    ) -> bool:
        """Ask the approvers about `call`, who have `answer_within` seconds (or take up the
        request a restart left pending for it); True only if one of them allowed it in time.
        `grantable`: a durable grant of the tool here answers at once, and the approvers
        may give one. `asker`: who the run answers (for the audit log)."""
        if grantable and (grant := await self._grant(conv, call.name)) is not None:
            data = {
                "tool": call.name,
                "grant": grant.id,
                "scope": grant.scope,
                "by": grant.granted_by,
            }
            self.events.emit("agent.approval.granted", data, run_id=run_id, conv=conv)
            if self.audit is not None:
                detail = {**data, "call": call.arguments, "run": run_id}
                self.audit.record("approval.granted", grant.granted_by, detail, conv=conv)
            metrics.approval("granted")
            return True
        try:
            row = await self._take_up(conv, run_id, call, summary, reason, answer_within, asker)
        except StoreError:
            log.warning("approval for %s not stored; denied", call.name, exc_info=True)
            return False
        if row.answer is not None:  # clicked after a restart, before the run got here
            self.store.approval_resolved(row.id, row.answer)
            return row.answer == "approved"
        left = (row.deadline or 0.0) - time.time()
        if left <= 0 and row.prompt is None:  # never shown and already too late
            self._waiting.discard(row.id)
            self.store.approval_resolved(row.id, "denied")
            return False
        metrics.approval("asked")
        record = _Record(
            self.store, row.id, self._closing, self.events, conv, run_id, call.name, self.audit
        )
        request = ApprovalRequest(
            row.id,
            call.name,
            summary,
            reason,
            max(0.0, left),
            prompt=row.prompt,
            record=record,
            grantable=grantable,
        )
        try:
            with tracing.span(f"approval {call.name}", {"gen_ai.tool.name": call.name}):
                if self.notices is None:
                    allowed = await responder.approve(request)
                else:
                    allowed = await self._approve_shared(responder, request, record)
        except asyncio.CancelledError:
            if _lost():
                pass  # the run went on with another worker, which takes the request up
            elif self._closing() and run_id is not None:
                self.held.add(run_id)  # pending still: the next process takes it up
            else:
                self.store.approval_resolved(row.id, "cancelled")
            raise
        except Exception:
            log.warning("approval prompt failed", exc_info=True)
            allowed = False
        finally:
            self._waiting.discard(row.id)
        if _lost():  # the request is the worker's that took the run over
            return False
        self.store.approval_resolved(row.id, "approved" if allowed else "denied")
        if self.audit is not None and not record.elsewhere:  # else: where it was answered
            kind = "approval.granted" if allowed else "approval.denied"
            detail = {"request": row.id, "tool": call.name, "call": summary, "run": run_id}
            self.audit.record(kind, record.answered_by or "unknown", detail, conv=conv)
        late = not allowed and time.time() >= (row.deadline or 0.0)
        metrics.approval("granted" if allowed else "timed_out" if late else "denied")
        return allowed

    async def _grant(self, conv: str, tool: str) -> GrantRow | None:
        """A grant of `tool` in this conversation or its channel, if any (a store that
        cannot answer grants nothing: the approver is asked)."""
        try:
            grants = await self.store.grants(grant_keys(conv))
        except StoreError:
            log.warning("grants not readable; asking instead", exc_info=True)
            return None
        return next((g for g in grants if g.tool == tool), None)

    async def _approve_shared(
        self, responder: Responder, request: ApprovalRequest, record: _Record
    ) -> bool:
        """`responder.approve`, or the answer another worker stored meanwhile (a click
        that arrived there): then the prompt is that worker's to settle."""
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._answers[request.id] = answered
        asking: asyncio.Future[bool] = asyncio.ensure_future(responder.approve(request))
        try:
            row = await self.store.approval(request.id)  # answered before we listened?
            if row is not None and row.answer is not None and not answered.done():
                answered.set_result(row.answer)
            either: set[asyncio.Future[Any]] = {asking, answered}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if asking.done():
                return asking.result()
            record.elsewhere = True
            asking.cancel()
            await asyncio.wait({asking})
            return bool(answered.result() == "approved")
        except asyncio.CancelledError:
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asking
            raise
        finally:
            self._answers.pop(request.id, None)
            answered.cancel()

    async def answered_elsewhere(self, request_id: str) -> None:
        """A notice: another worker stored an answer to `request_id`; if a run here
        waits on it, it has its answer."""
        waiter = self._answers.get(request_id)
        if waiter is None or waiter.done():
            return
        row = await self.store.approval(request_id)
        if row is not None and row.answer is not None and not waiter.done():
            waiter.set_result(row.answer)

    async def _take_up(
        self,
        conv: str,
        run_id: str | None,
        call: ToolCall,
        summary: str,
        reason: str,
        answer_within: float,
        asker: str = "",
    ) -> ApprovalRow:
        """The pending request of this call (a resumed run), else a new one, committed."""
        async with self._lock:
            row = None
            if run_id and call.id:
                row = await self.store.pending_approval(run_id, call.id)
            if row is not None and (row.tool, row.summary) != (call.name, summary):
                self.store.approval_resolved(row.id, "expired")  # an id reused by another call
                row = None
            if row is None:
                now = time.time()
                row = ApprovalRow(
                    uuid.uuid4().hex[:12],
                    conv,
                    run_id,
                    call.id or None,
                    call.name,
                    summary,
                    reason,
                    "pending",
                    now,
                    now + answer_within,
                    None,
                    None,
                    None,
                )
                await self.store.request_approval(row)  # before anyone can click on it
                if self.audit is not None:
                    detail = {
                        "request": row.id,
                        "tool": call.name,
                        "call": summary,
                        "reason": reason,
                        "run": run_id,
                    }
                    actor = asker or _asker_of(run_id)
                    self.audit.record("approval.asked", actor, detail, conv=conv)
            else:
                left = round((row.deadline or 0.0) - time.time(), 1)
                data = {"tool": row.tool, "left": left, "answered": row.answer is not None}
                self.events.emit("agent.approval.resumed", data, run_id=run_id, conv=conv)
            if row.answer is None:
                self._waiting.add(row.id)
            return row

    async def answer(
        self, request_id: str, allow: bool, user_name: str, scope: GrantScope | None = None
    ) -> ApprovalRequest | None:
        """`AgentPort.answer_approval`: store an approver's answer to a pending request no
        run of this process waits on yet (and the grant an "always" answer gives)."""
        async with self._lock:
            if request_id in self._waiting:
                return None  # the channel that shows it has it pending
            row = await self.store.approval(request_id)
            if row is None or row.state != "pending" or row.answer is not None:
                return None
            if row.run_id is None or row.deadline is None or time.time() >= row.deadline:
                return None  # not one a run takes up again, or too late
            answer = "approved" if allow else "denied"
            await self.store.answer_approval(row.id, answer, user_name)
            if self.audit is not None:
                kind = "approval.granted" if allow else "approval.denied"
                detail = {"request": row.id, "tool": row.tool, "run": row.run_id}
                self.audit.record(kind, user_name, detail, conv=row.conv)
            if allow and scope is not None:
                grant = new_grant(row.conv, row.tool, scope, user_name)
                self.store.add_grant(grant)
                data = {"tool": row.tool, "scope": scope, "key": grant.key, "by": user_name}
                self.events.emit("agent.grant.added", data, run_id=row.run_id, conv=row.conv)
                if self.audit is not None:
                    detail = {**data, "grant": grant.id}
                    self.audit.record("grant.added", user_name, detail, conv=row.conv)
            if self.notices is not None:  # the run may wait on another worker
                await self.notices.publish("approval", row.id)
        self.events.emit(
            "agent.approval.answered", {"answer": answer}, run_id=row.run_id, conv=row.conv
        )
        return ApprovalRequest(row.id, row.tool, row.summary, row.reason, 0.0, prompt=row.prompt)

    async def refused(self, request_id: str, actor: str, who: dict[str, str]) -> None:
        """`AgentPort.approval_refused`: `actor` clicked request `request_id`'s prompt but
        may not answer it; recorded with the request's tool and run where it is known (a
        click may name a request long gone, or none at all)."""
        if self.audit is None:
            return
        detail: dict[str, Any] = {"request": request_id, **who}
        conv = ""
        try:
            row = await self.store.approval(request_id)
        except StoreError:
            log.warning("approval %s: the refused click's request was not read", request_id)
            row = None
        if row is not None:
            detail |= {"tool": row.tool, "run": row.run_id}
            conv = row.conv
        self.audit.record("approval.refused", actor, detail, conv=conv)


class LaneApprover:
    """A lane's approver (`core.tools.base.CallApprover`): asks through the lane's current
    responder, keyed by the lane's running run and the tool call."""

    __slots__ = ("asker", "desk", "lane", "timeout")

    def __init__(
        self, desk: ApprovalDesk, lane: Lane, timeout: Callable[[], float], asker: str = ""
    ) -> None:
        self.desk, self.lane, self.timeout, self.asker = desk, lane, timeout, asker

    async def __call__(self, tool: str, summary: str, reason: str) -> bool:
        """A call without an id (outside the loop): asked, but not taken up after a restart."""
        return await self.approve_call(ToolCall(id="", name=tool), summary, reason)

    async def approve_call(
        self, call: ToolCall, summary: str, reason: str, *, grantable: bool = False
    ) -> bool:
        lane = self.lane
        if lane.responder is None:
            return False
        return await self.desk.ask(
            lane.responder,
            lane.conv_id,
            lane.run_id,
            call,
            summary,
            reason,
            self.timeout(),
            grantable=grantable,
            asker=self.asker,
        )


__all__ = ["ApprovalDesk", "LaneApprover"]
