"""The durable agent (docs/durability.md, docs/commands.md): lanes, runs, commands, goals,
approvals, recovery.

`Agent` (agent.py) takes input and keeps one `Lane` (lane.py) per conversation; the one
`Dispatcher` (dispatcher.py, with intake.py; `Workers` in workers.py when several workers
share a store) hands out the store's queue of runs; a `Turn` (turn.py) is one durable run
of the tool loop; `recovery.py` picks up what a crash left, and `resuming.py` goes on with
an interrupted run (`/resume`, `/skip`); `commands.py` (with the one `command_table.py`)
and `goals.py` see the agent only as a `LaneHost`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy import lazy_names

if TYPE_CHECKING:
    from core.agent.agent import MAX_LANES, Agent, conv_id
    from core.agent.lane import Lane, RunReport
    from core.agent.recovery import parse_conv
    from core.agent.responders import QuietResponder

# Imported on first use (PEP 562): `parley chat -m` needs `core.agent.conversation` and
# not the durable agent behind these names (docs/benchmarks.md).
_HOMES = {
    "MAX_LANES": "agent",
    "Agent": "agent",
    "conv_id": "agent",
    "Lane": "lane",
    "RunReport": "lane",
    "parse_conv": "recovery",
    "QuietResponder": "responders",
}


__getattr__ = lazy_names(__name__, _HOMES)


__all__ = ["MAX_LANES", "Agent", "Lane", "QuietResponder", "RunReport", "conv_id", "parse_conv"]
