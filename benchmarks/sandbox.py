"""What the kernel sandbox costs per tool call (SPEC §4; goal: ≤ 5 ms added).

One run times the same calls unconfined (`sandbox = "off"`) and confined (`"auto"`),
interleaved in rounds so drift hits both alike: a `bash` call (`bash -c true`) through the
real `BashTool`, a tools.yaml CLI tool (`true`) and the file tools (`read_file`,
`write_file` of 100 bytes, `list_directory`) through the real executor, in a
conversation's run (its workspace, scratch dir and confined file thread). A third
executor, confined with the write quotas off, shows what the quota watch adds to a call.
Medians of `--calls` calls per round, over `--rounds` rounds.

    .venv/bin/python benchmarks/sandbox.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from core.messages import ToolCall
from core.run_context import RunContext
from core.tools import landlock
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.cli import CliTool, CliToolSpec
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.sandbox import jail_of, release_site
from core.tools.settings import SandboxSettings
from core.tools.site import site_for

MODES = {"off": "off", "auto": "auto", "auto, no quotas": "auto"}


def _executor(root: Path, label: str) -> tuple[ToolExecutor, RunContext]:
    quotas = {} if label != "auto, no quotas" else {"max_call_write_bytes": 0}
    settings = SandboxSettings(
        workspace=root / "ws",
        artifacts_dir=root / "art",
        allowed_paths=[root / "data"],
        sandbox=MODES[label],  # type: ignore[arg-type]
        **quotas,  # type: ignore[arg-type]
    )
    if quotas:
        settings.max_conversation_write_bytes = 0
    cli = CliTool(
        CliToolSpec(name="noop", description="Does nothing.", category="read", cmd="true"), {}
    )
    scratch = root / f"scratch-{label.replace(' ', '')}"
    tools = ToolRegistry([*builtin_tools(), cli])
    run = RunContext(run_id=scratch.name, conv=f"bench:{scratch.name}:", scratch=scratch)
    return ToolExecutor(tools, ToolPolicy(), ToolContext(settings)), run


async def _time(executor: ToolExecutor, run: RunContext, call: ToolCall, n: int) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        message = await executor.execute(call, run)
        samples.append(time.perf_counter() - start)
        assert not message.is_error, message.content
    return statistics.median(samples) * 1000


def _calls(root: Path) -> dict[str, ToolCall]:
    (root / "data").mkdir()
    (root / "data" / "f.txt").write_text("hello world\n" * 200)
    args = {
        "bash": ("bash", {"command": "true"}),
        "cli": ("noop", {}),
        "read_file": ("read_file", {"path": str(root / "data" / "f.txt")}),
        "write_file": ("write_file", {"path": "w.txt", "content": "x" * 100}),
        "list_directory": ("list_directory", {"path": str(root / "data")}),
    }
    return {
        label: ToolCall(id=label, name=name, arguments=json.dumps(arguments))
        for label, (name, arguments) in args.items()
    }


async def main(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        to_time = _calls(root)
        executors = {label: _executor(root, label) for label in MODES}
        print(jail_of(executors["auto"][0].ctx).describe())
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for mode, (executor, run) in executors.items():
                for label, call in to_time.items():
                    median = await _time(executor, run, call, calls)
                    results.setdefault((label, mode), []).append(median)
        for executor, run in executors.values():
            release_site(site_for(executor.ctx.sandbox, run.conv, run.scratch))
    print(f"\n| call | unconfined | sandboxed | added | (Landlock ABI {landlock.abi_version()})")
    print("|---|---|---|---|")
    for label in to_time:
        off = statistics.median(results[(label, "off")])
        on = statistics.median(results[(label, "auto")])
        print(f"| {label} | {off:.2f} ms | {on:.2f} ms | {on - off:+.2f} ms |")
    print("\n| call, sandboxed | write quotas off | on | added |")
    print("|---|---|---|---|")
    for label in ("bash", "cli", "write_file"):
        off = statistics.median(results[(label, "auto, no quotas")])
        on = statistics.median(results[(label, "auto")])
        print(f"| {label} | {off:.2f} ms | {on:.2f} ms | {on - off:+.2f} ms |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
