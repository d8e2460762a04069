"""What each `[context] strategy` keeps of the step in progress
(docs/context.md#context-strategies).

A scripted session of three subgoals (inspect the logs, patch the config, run the tests),
each several tool calls with large outputs, runs through the real `ContextManager` (window
16,000 tokens, tiktoken counts) the way the tool loop drives it: a pre-flight before every
LLM call, then the assistant's call and its result. Offline and deterministic: the summary
model answers a fixed summary, the subgoal extractor names the phase of the newest tool call
in its window, and each extraction is awaited before the next step (in real runs it only
runs beside the loop).

Under `focus` the scripted model brackets each phase itself: `start_focus` before its
first tool call, `complete_focus` with a short summary after its last
(docs/context.md#the-focus-strategy).

After each compaction it records the fraction of the active subgoal's tool outputs still in
the history verbatim, and the tokens after it. Usage (from the repo root)::

    .venv/bin/python benchmarks/compaction.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.context.focus import PENDING  # noqa: E402
from core.context.manager import ContextManager, ContextSettings  # noqa: E402
from core.context.subgoals import SUBGOAL_PROMPT  # noqa: E402
from core.context.tokens import TokenCounter  # noqa: E402
from core.events import LoopEvent, Observed  # noqa: E402
from core.messages import Message, ToolCall  # noqa: E402

WINDOW = 16_000
STRATEGIES = ("summary", "subgoal", "subgoal_mig", "focus")
PHASES = (  # (subgoal, tool, steps)
    ("inspect the service logs", "read_log", 8),
    ("patch the config", "edit_config", 8),
    ("run the tests and report", "run_tests", 8),
)
VOCAB = [
    "error",
    "warn",
    "info",
    "retry",
    "timeout",
    "config",
    "key",
    "value",
    "path",
    "test",
    "pass",
    "fail",
    "node",
    "disk",
]
EXTRACT_MARK = SUBGOAL_PROMPT.split("{", 1)[0][:40]


def output(phase: int, step: int, lines: int) -> str:
    """A large, deterministic tool output; step 0 and 1 of a phase repeat each other a lot
    (a re-read), which MIG scores as redundant."""
    rng = random.Random(phase * 100 + (0 if step < 2 else step))
    rows = [
        f"{PHASES[phase][1]}[{phase}.{step}] line {i}: "
        + " ".join(rng.choice(VOCAB) for _ in range(8))
        + f" id={rng.randrange(10**6)}"
        for i in range(lines)
    ]
    return f"output {phase}.{step}\n" + "\n".join(rows)


async def model(prompt: str) -> str:
    """The cheap model: an extraction names the phase of the newest tool call it sees;
    anything else gets a fixed summary."""
    if not prompt.startswith(EXTRACT_MARK):
        return "Summary: the logs were read, the config was patched; details are above."
    newest = max(((prompt.rfind(f"({tool}"), name) for name, tool, _ in PHASES), key=lambda t: t[0])
    return f"SUBGOAL: {newest[1]}" if newest[0] >= 0 else "NONE"


@dataclass
class Result:
    """Per compaction: the active phase, verbatim fraction and tokens after."""

    rows: list[tuple[int, float, int, str]] = field(default_factory=list)


async def session(strategy: str, lines: int) -> Result:
    settings = ContextSettings(strategy=strategy, taco_threshold=100_000)  # type: ignore[arg-type]
    cm = ContextManager(WINDOW, TokenCounter(), model, settings)
    events: list[LoopEvent] = []
    messages = [
        Message.system("You are Parley, a helpful assistant."),
        Message.user("The service is failing: find why in the logs, fix the config, test it."),
    ]
    outputs: dict[str, str] = {}  # call id -> full output
    phase_of: dict[str, int] = {}
    result = Result()
    for phase, (_, tool, steps) in enumerate(PHASES):
        for step in range(steps):
            seen = len(events)
            await cm.preflight(messages, events.append)
            if cm.subgoals is not None:
                await cm.subgoals.settle()
            ran = [
                e.data
                for e in events[seen:]
                if isinstance(e, Observed) and e.name == "agent.compaction.run"
            ]
            if ran:  # one row per pre-flight that compacted: its stages, the outcome
                mine = [c for c, p in phase_of.items() if p == phase]
                present = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
                kept = sum(present.get(c) == outputs[c] for c in mine)
                fraction = kept / len(mine) if mine else 1.0
                kinds = "+".join(dict.fromkeys(str(d["kind"]) for d in ran))
                result.rows.append((phase, fraction, int(str(ran[-1]["after"])), kinds))
            if strategy == "focus" and step == 0:
                messages += focus_call("start_focus", phase, {"scope": PHASES[phase][0]})
            call = ToolCall(id=f"{tool}_{step}", name=tool, arguments=f'{{"step": {step}}}')
            outputs[call.id], phase_of[call.id] = output(phase, step, lines), phase
            messages += [
                Message.assistant(f"Step {step + 1} of {PHASES[phase][0]}.", (call,)),
                Message.tool_result(call, outputs[call.id]),
            ]
        if strategy == "focus":
            done = f"{PHASES[phase][0]}: done; {steps} calls of {tool}, key ids noted."
            messages += focus_call("complete_focus", phase, {"summary": done})
    await cm.aclose()
    return result


def focus_call(name: str, phase: int, args: dict[str, str]) -> list[Message]:
    """The scripted model's own focus call and the tool's answer."""
    call = ToolCall(id=f"{name}_{phase}", name=name, arguments=json.dumps(args))
    answer = PENDING if name == "complete_focus" else f"Focus started: {args.get('scope')}"
    return [Message.assistant("", (call,)), Message.tool_result(call, answer)]


async def run(quick: bool) -> None:
    lines = 30 if quick else 50
    print(
        "| strategy | compactions (kind@subgoal) | active outputs verbatim after each "
        "| mean | tokens after each |"
    )
    print("|---|---|---|---:|---|")
    for strategy in STRATEGIES:
        res = await session(strategy, lines)
        kinds = ", ".join(f"{k}@{p + 1}" for p, _, _, k in res.rows) or "none"
        fractions = ", ".join(f"{f:.2f}" for _, f, _, _ in res.rows) or "-"
        mean = statistics.mean(f for _, f, _, _ in res.rows) if res.rows else 1.0
        tokens = ", ".join(f"{a:,}" for _, _, a, _ in res.rows) or "-"
        print(f"| {strategy} | {kinds} | {fractions} | {mean:.2f} | {tokens} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller outputs (< 10 s)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
