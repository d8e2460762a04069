"""Tool policy: category × session kind (SPEC §4).

| category | interactive chat        | cron job                          |
|----------|-------------------------|-----------------------------------|
| read     | run                     | run                               |
| write    | run                     | only if listed in `allow_tools`   |
| admin    | ask a human approver    | blocked unless listed             |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.tools.base import Category

SessionKind = Literal["interactive", "cron"]
PolicyVerdict = Literal["run", "ask", "deny"]


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: PolicyVerdict
    reason: str


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """Who may run what. An "ask" verdict goes to the run's approver (`RunContext`);
    without one, "ask" denies."""

    session: SessionKind = "interactive"
    allow_tools: frozenset[str] = frozenset()

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
        return Decision("ask", f"`{tool_name}` is an admin action and needs a human approver")
