"""Approval prompts: an admin tool call waits for an approver's click (docs/tools.md#approvals).

The adapter shows the prompt with buttons whose data comes from `approval_button_id`:
Approve and Deny, and, when the request is `grantable`, "Always here" and "Always in this
channel" (an approve that also stores a durable grant: core/agent/approvals.py); a click
goes to `Approvals.resolve_click`. Only approvers decide (the members of a role that
approves, docs/governance.md#roles; without roles, the platform's `approvers`);
anyone else is told privately that they cannot. A timeout denies, and the prompt is
settled: edited to show the outcome with its buttons removed.

Requests survive a restart (the agent keeps them in its store): `show` returns where the
prompt is (a `PromptRef`, which the agent stores), a request taken up again after a
restart comes with that prompt and is not shown twice, `settle` edits whichever prompt
`request.prompt` names, and a click on a request this process is not waiting on yet is
answered through the agent (`AgentPort.answer_approval`). A shutdown leaves prompts as
they are, buttons and all, for the next process.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from typing import Any, Literal, NamedTuple

from core.chat import AgentPort, ApprovalRequest, Deciders, GrantScope, PromptRef
from core.clock import Clock, SystemClock
from core.secrets import scrub

log = logging.getLogger(__name__)

Show = Callable[[ApprovalRequest], Awaitable[object]]
"""Post the prompt; returns where it is (a `PromptRef`)."""
Settle = Callable[[ApprovalRequest, str], Awaitable[None]]
"""Edit the prompt at `request.prompt` to show the outcome, without buttons."""
Resolution = Literal["ok", "not_approver", "unknown"]

TIMED_OUT = "⌛ Timed out — denied"
CANCELLED = "🚫 Cancelled"

_BUTTON = re.compile(r"^apv:([A-Za-z0-9_-]{1,48}):([ynac])$")
_SCOPES: dict[str, GrantScope] = {"a": "conversation", "c": "channel"}
ALWAYS_LABELS: dict[GrantScope, str] = {
    "conversation": "Always here",
    "channel": "Always in this channel",
}


class Click(NamedTuple):
    """What an approval button says: its request, yes or no, and for an "always" button
    where the grant holds."""

    request_id: str
    allow: bool
    scope: GrantScope | None = None


def approval_button_id(request_id: str, allow: bool, scope: GrantScope | None = None) -> str:
    """Button data for approving (`allow`) or denying request `request_id`, or approving
    it always in `scope`; at most 56 bytes, within Telegram's 64-byte callback data."""
    code = {"conversation": "a", "channel": "c", None: "y" if allow else "n"}[scope]
    data = f"apv:{request_id}:{code}"
    if _BUTTON.match(data) is None:
        raise ValueError(f"unusable approval request id {request_id!r}")
    return data


def parse_approval_button(data: str) -> Click | None:
    """The click a button's data stands for, or None if it is not an approval button."""
    m = _BUTTON.match(data)
    if m is None:
        return None
    return Click(m[1], m[2] != "n", _SCOPES.get(m[2]))


def duration_text(seconds: float) -> str:
    """A timeout as people say it: "8 s", "90 s", "5 min", "1 h 30 min"."""
    whole = max(1, round(seconds))
    if whole < 120:
        return f"{whole} s"
    minutes = round(whole / 60)
    if minutes < 120:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def approved_text(user_name: str, scope: GrantScope | None = None) -> str:
    where = {None: "", "conversation": " (always, here)", "channel": " (always, in this channel)"}
    return f"✅ Approved by {user_name}{where[scope]}"


def denied_text(user_name: str) -> str:
    return f"❌ Denied by {user_name}"


class Approvals:
    """Pending approval requests of one adapter, and who may decide them."""

    button_id = staticmethod(approval_button_id)
    parse_button = staticmethod(parse_approval_button)

    def __init__(
        self,
        approvers: Collection[str],
        clock: Clock | None = None,
        *,
        deciders: Deciders | None = None,
        platform: str = "",
    ) -> None:
        """`approvers`: the platform's `approvers` setting, who decide when there are no
        `deciders` (the roles: docs/governance.md#roles) for `platform`."""
        self._approvers = frozenset(approvers)
        self._clock = clock or SystemClock()
        self._pending: dict[str, asyncio.Future[tuple[bool, str, GrantScope | None]]] = {}
        self.deciders, self.platform = deciders, platform

    def is_approver(self, user_id: str, groups: Sequence[str] = ()) -> bool:
        if self.deciders is not None:
            return self.deciders.approves(self.platform, user_id, groups)
        return user_id in self._approvers

    def wants_groups(self) -> bool:
        """Whether a click's groups must be looked up to decide who may answer it."""
        return self.deciders is not None and self.deciders.wants_groups(self.platform)

    def refusal(self) -> str:
        """What a person who may not answer a prompt is told (privately)."""
        roles = self.deciders.approver_roles() if self.deciders is not None else []
        if not roles:
            return "Only the configured approvers can answer this request."
        return f"Only approvers (role {' or '.join(roles)}) can answer this request."

    def is_pending(self, request_id: str) -> bool:
        return request_id in self._pending

    async def request(self, request: ApprovalRequest, show: Show, settle: Settle) -> bool:
        """Show the prompt (unless `request.prompt` is one posted before a restart), wait
        for a decision or `request.timeout` seconds, settle the prompt with the outcome;
        True only if an approver allowed it."""
        if request.id in self._pending:
            raise ValueError(f"approval {request.id} is already pending")
        # The prompt is a post like any other: no configured secret in it.
        request = replace(request, summary=scrub(request.summary), reason=scrub(request.reason))
        loop = asyncio.get_running_loop()
        decision: asyncio.Future[tuple[bool, str, GrantScope | None]] = loop.create_future()
        self._pending[request.id] = decision
        try:
            if request.prompt is None:
                posted = await show(request)
                if isinstance(posted, PromptRef):
                    request = replace(request, prompt=posted)
                    if request.record is not None:
                        request.record.posted(posted)
            outcome = await self._wait(decision, request.timeout)
        except asyncio.CancelledError:
            record = request.record
            if record is None or not record.outlives_cancellation():
                await self._settle_quietly(settle, request, CANCELLED)
            raise
        finally:
            self._pending.pop(request.id, None)
            decision.cancel()
        if outcome is None:
            allowed, text, name, scope = False, TIMED_OUT, "", None
        else:
            allowed, name, scope = outcome
            if not request.grantable:
                scope = None  # a prompt without "always" buttons: an old or forged click
            if allowed and scope is not None and request.record is not None:
                request.record.granted(scope, name)
            text = approved_text(name, scope) if allowed else denied_text(name)
        if request.record is not None:
            request.record.answered(allowed, name)
        log.info("approval %s for %s: %s", request.id, request.tool, text)
        await self._settle_quietly(settle, request, text)  # the decision stands regardless
        return allowed

    async def _wait(
        self, decision: asyncio.Future[tuple[bool, str, GrantScope | None]], seconds: float
    ) -> tuple[bool, str, GrantScope | None] | None:
        timer = asyncio.ensure_future(self._clock.sleep(max(0.0, seconds)))
        either: set[asyncio.Future[Any]] = {decision, timer}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            await asyncio.wait({timer})
        return decision.result() if decision.done() else None

    @staticmethod
    async def _settle_quietly(settle: Settle, request: ApprovalRequest, text: str) -> None:
        try:
            await settle(request, text)
        except Exception:
            log.warning("could not settle approval prompt %s", request.id, exc_info=True)

    def resolve(
        self,
        request_id: str,
        user_id: str,
        user_name: str,
        allow: bool,
        scope: GrantScope | None = None,
        groups: Sequence[str] = (),
    ) -> Resolution:
        """A click on a prompt button: "ok" if it decided the request, "not_approver" if
        the user may not decide (tell them privately), "unknown" if the request is not
        pending (already decided, timed out, or never existed). `scope`: an "always"
        button's; `groups`: the user's platform groups (for roles that name groups)."""
        decision = self._pending.get(request_id)
        if decision is None or decision.done():
            return "unknown"
        if not self.is_approver(user_id, groups):
            log.info("approval %s: %s is not an approver", request_id, user_id)
            return "not_approver"
        decision.set_result((allow, user_name, scope if allow else None))
        del self._pending[request_id]
        return "ok"

    async def resolve_click(
        self,
        request_id: str,
        user_id: str,
        user_name: str,
        allow: bool,
        *,
        agent: AgentPort | None,
        settle: Settle,
        scope: GrantScope | None = None,
        groups: Sequence[str] = (),
    ) -> Resolution:
        """A click on a prompt button, also on a prompt posted before a restart: `resolve`
        for a request this process waits on, else (an approver only) the agent's
        `answer_approval` for one it stores, whose prompt is then settled here. A click
        by someone who may not answer goes to the agent's audit log."""
        verdict = self.resolve(request_id, user_id, user_name, allow, scope, groups)
        if verdict == "unknown" and agent is not None and not self.is_approver(user_id, groups):
            verdict = "not_approver"
        if verdict == "not_approver" and agent is not None:
            await agent.approval_refused(request_id, self.platform, user_id, user_name, groups)
        if verdict != "unknown" or agent is None:
            return verdict
        try:
            if scope is not None and allow:
                stored = await agent.answer_approval(request_id, allow, user_name, scope)
            else:
                stored = await agent.answer_approval(request_id, allow, user_name)
        except Exception:
            log.warning("approval %s: the answer was not stored", request_id, exc_info=True)
            return "unknown"
        if stored is None:  # a run may have taken it up meanwhile
            return self.resolve(request_id, user_id, user_name, allow, scope, groups)
        text = approved_text(user_name, scope) if allow else denied_text(user_name)
        log.info("approval %s for %s: %s (answered after a restart)", request_id, stored.tool, text)
        await self._settle_quietly(settle, stored, text)
        return "ok"
