"""Tool policy: category × session kind (docs/tools.md).

| category | interactive chat        | cron job                          |
|----------|-------------------------|-----------------------------------|
| read     | run                     | run                               |
| write    | run                     | only if listed in `allow_tools`   |
| admin    | ask a human approver    | blocked unless listed             |

A child run (`delegate`) has its parent's policy without approvals: nobody is there to ask,
so its admin actions are refused.
"""

from __future__ import annotations

from typing import Literal

from core.records import record
from core.tools.base import Category

SessionKind = Literal["interactive", "cron"]
PolicyVerdict = Literal["run", "ask", "deny"]


@record(frozen=True, slots=True)
class Decision:
    verdict: PolicyVerdict
    reason: str


@record(frozen=True, slots=True)
class ToolPolicy:
    """Who may run what. An "ask" verdict goes to the run's approver (`RunContext`);
    without one, "ask" denies."""

    session: SessionKind = "interactive"
    allow_tools: frozenset[str] = frozenset()
    approvals: bool = True  # False: nobody to ask (a child run), so "ask" denies

    def without_approvals(self) -> ToolPolicy:
        """The same policy for a run with nobody to ask: admin actions are refused."""
        return ToolPolicy(self.session, self.allow_tools, approvals=False)

    def decide(self, tool_name: str, category: Category) -> Decision:
        if category == "read":
            return Decision("run", "read tools always run")
        if self.session == "cron":
            if tool_name in self.allow_tools:
                return Decision("run", f"`{tool_name}` is listed in the job's allow_tools")
            return Decision(
                "deny",
                f"`{tool_name}` is a {category} tool and this cron job does not list it in "
                "allow_tools",
            )
        if category == "write":
            return Decision("run", "write tools run in interactive chat")
        if not self.approvals:
            return Decision(
                "deny",
                f"`{tool_name}` is an admin action and needs a human approver, and a child "
                "run has nobody to ask; leave that step to the parent run",
            )
        return Decision("ask", f"`{tool_name}` is an admin action and needs a human approver")


@record(frozen=True, slots=True)
class PolicyGate:
    """A `core.tools.base.RoleGate` that is a policy: what it would deny is not offered.
    A trigger's run has no person's roles; its policy (the cron policy and its
    `allow_tools`) is what it may use, and a model shown only those cannot be talked by
    a payload into trying the rest (docs/triggers.md#untrusted-data)."""

    policy: ToolPolicy

    @property
    def names(self) -> str:
        return f"{self.policy.session} policy"

    def allows_tool(self, tool: str, category: str) -> bool:
        return self.tool_refusal(tool, category) is None

    def tool_refusal(self, tool: str, category: str) -> str | None:
        decision = self.policy.decide(tool, category)  # type: ignore[arg-type]
        return decision.reason if decision.verdict == "deny" else None
