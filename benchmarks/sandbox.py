"""What the kernel sandbox costs per tool call (SPEC §4; goal: ≤ 5 ms added).

One run times the same calls unconfined (`sandbox = "off"`), confined but without the
per-call PID namespace, and confined (`"auto"`), interleaved in rounds so drift hits all
alike: a `bash` call (`bash -c true`) through the real `BashTool`, and a tools.yaml CLI
tool (`true`, read-only as its category is read) through the real executor. Medians of
`--calls` calls per round, over `--rounds` rounds.

    .venv/bin/python benchmarks/sandbox.py
    .venv/bin/python benchmarks/sandbox.py --user parleytest  # as root: an ordinary user's
        Parley (user + PID namespace through util-linux unshare)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import statistics
import tempfile
import time
from pathlib import Path

from core.messages import ToolCall
from core.tools import landlock
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashTool
from core.tools.cli import CliTool, CliToolSpec
from core.tools.executor import ToolExecutor
from core.tools.jail import Jail
from core.tools.policy import ToolPolicy
from core.tools.sandbox import jail_of
from core.tools.settings import SandboxSettings

MODES = ("off", "no-pidns", "auto")


def _executor(root: Path, mode: str) -> ToolExecutor:
    settings = SandboxSettings(
        workspace=root / "ws",
        artifacts_dir=root / "art",
        sandbox="off" if mode == "off" else "auto",
    )
    cli = CliTool(
        CliToolSpec(name="noop", description="Does nothing.", category="read", cmd="true"), {}
    )
    jail = Jail(settings)
    if mode == "no-pidns":  # what the sandbox cost before each call had its namespace
        jail.pid_namespaces = None
    ctx = ToolContext(settings, jail=jail, scratch=root / f"scratch-{mode}")
    return ToolExecutor(ToolRegistry([BashTool(), cli]), ToolPolicy(), ctx)


async def _time(executor: ToolExecutor, call: ToolCall, n: int) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        message = await executor.execute(call)
        samples.append(time.perf_counter() - start)
        assert not message.is_error, message.content
    return statistics.median(samples) * 1000


async def main(calls: int, rounds: int) -> None:
    bash = ToolCall(id="b", name="bash", arguments=json.dumps({"command": "true"}))
    noop = ToolCall(id="n", name="noop", arguments="{}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the tools' user must reach the workspace
        executors = {mode: _executor(root, mode) for mode in MODES}
        print(jail_of(executors["auto"].ctx).describe())
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for mode, executor in executors.items():
                for label, call in (("bash", bash), ("cli", noop)):
                    median = await _time(executor, call, calls)
                    results.setdefault((label, mode), []).append(median)
    print(
        "\n| call | unconfined | sandboxed | added | of which the PID namespace |"
        f" (Landlock ABI {landlock.abi_version()})"
    )
    print("|---|---|---|---|---|")
    for label in ("bash", "cli"):
        off, bare, on = (statistics.median(results[(label, mode)]) for mode in MODES)
        print(
            f"| {label} | {off:.2f} ms | {on:.2f} ms | {on - off:+.2f} ms | {on - bare:+.2f} ms |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--user", help="(as root) measure as this user's Parley")
    args = parser.parse_args()
    if args.user:  # every module is imported by now: drop to the user, as a probe would
        entry = pwd.getpwnam(args.user)
        os.environ.update(HOME=entry.pw_dir, TMPDIR=tempfile.mkdtemp(prefix="parley-bench-"))
        os.chmod(os.environ["TMPDIR"], 0o777)
        tempfile.tempdir = os.environ["TMPDIR"]
        os.setgroups([])
        os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
        os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    asyncio.run(main(args.calls, args.rounds))
