"""The `delegate` tool (docs/delegation-memory.md): hand independent sub-tasks to child runs that
work in
parallel, and get their answers back as one tool result.

The tool only checks its arguments and renders the outcome; the run that calls it starts
the children (its `Delegator`, `core.agent.children`), each a durable run in its own lane.
The tool is `resumable`: after a crash it is run again, and the children that had
finished are replayed from the store rather than run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ToolDenied, ToolValidationError
from core.sandbox import SandboxSettings, cap_output
from core.tools.base import Category, Tool, ToolContext, ToolResult
from core.tools.delegation import ChildOutcome, ChildTask
from core.tools.running import site_of

DELEGATE = "delegate"
RESULT_CHARS = 7_000
"""What the children's answers may take of the one tool result, shared among them: about
the size under which context management keeps a tool output verbatim (`taco_threshold`)."""
MIN_CHILD_CHARS = 1_000


class ChildTaskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instruction: str = Field(
        min_length=1,
        max_length=20_000,
        description="All the child needs (it cannot see this chat), and what to report.",
    )
    tools: list[str] | None = Field(
        default=None,
        description="Tools it may use (default: yours).",
    )
    max_iterations: int | None = Field(
        default=None, ge=1, description="LLM-call budget (at most yours)."
    )


class DelegateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[ChildTaskParams] = Field(
        min_length=1, description="One child run per task, all at once."
    )


class DelegateTool(Tool):
    """Starts up to `max_children` child runs in parallel; refuses deeper than `max_depth`.

    Args:
        max_children: tasks one call may hand out (`[agent] max_children`).
        max_depth: runs at depth 0 … max_depth-1 may delegate (`[agent] max_depth`).
        timeout: seconds the whole call may take (the parent's hard time limit; children
            end earlier, by their own deadline inside the parent's).
    """

    name = DELEGATE
    description = (
        "Run independent sub-tasks as parallel child runs; returns each child's answer, "
        "state and artifacts."
    )
    category: Category = "write"
    params = DelegateParams
    resumable = True

    def __init__(self, max_children: int = 4, max_depth: int = 1, timeout: float = 1200.0):
        self.max_children, self.max_depth, self.max_seconds = max_children, max_depth, timeout

    def schema(self) -> dict[str, Any]:
        schema = super().schema()
        schema["properties"]["tasks"]["maxItems"] = self.max_children
        return schema

    def validate(self, raw_arguments: str) -> BaseModel:
        args = super().validate(raw_arguments)
        assert isinstance(args, DelegateParams)
        if len(args.tasks) > self.max_children:
            raise ToolValidationError(
                f"`delegate` starts at most {self.max_children} child runs at once and got "
                f"{len(args.tasks)} tasks; merge tasks or delegate them in batches of "
                f"{self.max_children}"
            )
        return args

    def call_timeout(self, args: BaseModel, sandbox: SandboxSettings) -> float:
        return self.max_seconds  # not the sandbox's cap: children have their own deadlines

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, DelegateParams)
        delegator = ctx.delegator
        if delegator is None or delegator.depth >= self.max_depth:
            raise ToolDenied(
                f"this run may not delegate (runs deeper than [agent] max_depth = "
                f"{self.max_depth} cannot); do the work yourself"
            )
        tasks = [
            ChildTask(
                t.instruction,
                tuple(t.tools) if t.tools is not None else None,
                t.max_iterations,
            )
            for t in args.tasks
        ]
        outcomes = await delegator.delegate(ctx.call_id, tasks)
        text, files = render_outcomes(tasks, outcomes, site_of(ctx).artifacts)
        artifacts = tuple(files) + tuple(p for o in outcomes for p in _paths(o.artifacts))
        return ToolResult(
            text, is_error=not any(o.state == "completed" for o in outcomes), artifacts=artifacts
        )


def render_outcomes(
    tasks: Sequence[ChildTask], outcomes: Sequence[ChildOutcome], artifacts_dir: Path
) -> tuple[str, list[Path]]:
    """The one tool result: a count by state, then per child its state, run, task, answer
    (head and tail if long, the whole kept in an artifact file in the conversation's
    `artifacts_dir`) and artifacts."""
    states = Counter(o.state for o in outcomes)
    summary = ", ".join(f"{n} {state}" for state, n in states.items())
    parts = [f"{len(outcomes)} child run{'s' if len(outcomes) != 1 else ''}: {summary}."]
    budget = max(MIN_CHILD_CHARS, RESULT_CHARS // max(1, len(outcomes)))
    files: list[Path] = []
    for number, (task, outcome) in enumerate(zip(tasks, outcomes, strict=True), start=1):
        replayed = "; finished before a restart, taken from the store" if outcome.replayed else ""
        parts.append(
            f"## Child {number}: {outcome.state} (run {outcome.run_id}, "
            f"{outcome.iterations} iterations{replayed})\n"
            f"Task: {_short(task.instruction, 200)}"
        )
        answer, file = _answer(outcome, budget, artifacts_dir)
        if file is not None:
            files.append(file)
        lines = [answer or "(no answer)"]
        if outcome.artifacts:
            lines.append("Artifacts: " + ", ".join(outcome.artifacts))
        parts.append("\n".join(lines))
    return "\n\n".join(parts), files


def _answer(outcome: ChildOutcome, budget: int, artifacts_dir: Path) -> tuple[str, Path | None]:
    """The child's answer, cut to `budget` characters (head and tail); the whole answer
    goes to an artifact file the parent can `read_file`."""
    data = outcome.text.encode()
    if len(outcome.text) <= budget:
        return outcome.text, None
    artifact: Path | None = artifacts_dir / f"child-{outcome.run_id}.txt"
    try:
        assert artifact is not None
        artifact.parent.mkdir(parents=True, exist_ok=True)
        artifact.write_bytes(data)
    except OSError:
        artifact = None
    text, _cut, _bytes = cap_output(data, budget, artifact)
    return text, artifact


def _short(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _paths(names: Sequence[str]) -> list[Path]:
    return [Path(n) for n in names if n.startswith("/")]


__all__ = ["DELEGATE", "ChildTaskParams", "DelegateParams", "DelegateTool", "render_outcomes"]
