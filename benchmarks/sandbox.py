"""What the kernel sandbox costs per tool call (docs/tools.md; goal: ≤ 5 ms added).

One run times the same calls unconfined (`sandbox = "off"`) and confined under each
network mode (`network = true`, `false`, `"public"`), interleaved in rounds so drift hits
all alike: a `bash` call (`bash -c true`) through the real `BashTool`, and a tools.yaml
CLI tool (`true`) through the real executor. Then what the connect supervisor adds to
one connect: a bash call making 50 TCP connects to a loopback listener, with
`network = true` (connect is the kernel's) and with a unix socket listed (every connect
is checked and made by the supervisor). The column "no PID namespace" is `network =
true` without the per-call PID namespace: the difference is that namespace's cost. Medians
of `--calls` calls per round, over `--rounds` rounds. The file tools (`read_file`,
`write_file` of 100 bytes, `list_directory`) are timed too, in a conversation's run (its
workspace, scratch dir and confined file thread), and "no write quotas" shows what the
quota watch adds to a call.

    .venv/bin/python benchmarks/sandbox.py
    .venv/bin/python benchmarks/sandbox.py --user parleytest  # as root: an ordinary user's
        Parley (a user + PID namespace through util-linux unshare)
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
from typing import Any

from core.messages import ToolCall
from core.run_context import RunContext
from core.sandbox import Jail, SandboxSettings, abi_version, site_for
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.cli import CliTool, CliToolSpec
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import jail_of, release_site

MODES: dict[str, dict[str, Any]] = {
    "unconfined": {"sandbox": "off"},
    "no PID namespace": {},
    "network = true": {},
    "network = false": {"network": False},
    'network = "public"': {"network": "public"},
    "no write quotas": {"max_call_write_bytes": 0, "max_conversation_write_bytes": 0},
}
CONNECTS = 50


Bench = tuple[ToolExecutor, RunContext]


def _executor(root: Path, name: str, **settings: Any) -> Bench:
    sandbox = SandboxSettings(
        workspace=root / "ws", artifacts_dir=root / "art", allowed_paths=[root / "data"], **settings
    )
    cli = CliTool(
        CliToolSpec(name="noop", description="Does nothing.", category="read", cmd="true"), {}
    )
    jail = Jail(sandbox)
    if name == "no PID namespace":  # the sandbox as it was before each call had one
        jail.pid_namespaces = None
    scratch = root / f"scratch-{len(name)}-{abs(hash(name))}"
    run = RunContext(run_id=scratch.name, conv=f"bench:{scratch.name}:", scratch=scratch)
    tools = ToolRegistry([*builtin_tools(), cli])
    return ToolExecutor(tools, ToolPolicy(), ToolContext(sandbox, jail=jail)), run


def _release(bench: Bench) -> None:
    executor, run = bench
    release_site(site_for(executor.ctx.sandbox, run.conv, run.scratch))


async def _time(bench: Bench, call: ToolCall, n: int) -> float:
    executor, run = bench
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


async def _per_call(root: Path, calls: int, rounds: int) -> None:
    to_time = _calls(root)
    benches = {name: _executor(root, name, **settings) for name, settings in MODES.items()}
    for name in list(MODES)[1:-1]:
        print(jail_of(benches[name][0].ctx).describe())
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for name, bench in benches.items():
            for label, call in to_time.items():
                results.setdefault((label, name), []).append(await _time(bench, call, calls))
    for bench in benches.values():
        _release(bench)
    print(f"\n| call | {' | '.join(MODES)} | (Landlock ABI {abi_version()})")
    print("|---" * (len(MODES) + 1) + "|")
    for label in to_time:
        off = statistics.median(results[(label, "unconfined")])
        cells = [f"{off:.2f} ms"]
        for name in list(MODES)[1:]:
            on = statistics.median(results[(label, name)])
            cells.append(f"{on:.2f} ms ({on - off:+.2f})")
        print(f"| {label} | {' | '.join(cells)} |")


async def _per_connect(root: Path, calls: int, rounds: int) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    listed = root / "listed.sock"
    unix = await asyncio.start_unix_server(lambda r, w: w.close(), listed)
    script = f"for i in $(seq {CONNECTS}); do exec 3<>/dev/tcp/127.0.0.1/{port}; done\n"
    (root / "ws").mkdir(exist_ok=True)
    (root / "ws" / "connects.sh").write_text(script)  # a script: the seatbelt reads no file
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": "bash connects.sh"}))
    kernel = _executor(root, "kernel connects", workspace_scope="shared")
    supervised = _executor(
        root, "supervised connects", workspace_scope="shared", unix_sockets=[listed]
    )
    times: dict[str, list[float]] = {"kernel": [], "supervised": []}
    async with server, unix:
        for _ in range(rounds):
            times["kernel"].append(await _time(kernel, call, max(calls // 5, 3)))
            times["supervised"].append(await _time(supervised, call, max(calls // 5, 3)))
    _release(kernel)
    _release(supervised)
    plain, checked = (statistics.median(times[k]) for k in ("kernel", "supervised"))
    print(f"\n| {CONNECTS} TCP connects in one bash call | by the kernel | by the supervisor |")
    print("|---|---|---|")
    print(f"| call | {plain:.2f} ms | {checked:.2f} ms |")
    print(f"| per connect | | {(checked - plain) / CONNECTS * 1000:+.0f} µs |")


async def main(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # the tools' user must reach the workspace
        await _per_call(Path(tmp), calls, rounds)
        await _per_connect(Path(tmp), calls, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--user", help="(as root) measure as this user's Parley")
    args = parser.parse_args()
    if args.user:  # every module is imported by now: drop to the user, as a probe would
        entry = pwd.getpwnam(args.user)
        tempfile.tempdir = tempfile.mkdtemp(prefix="parley-bench-")
        os.chmod(tempfile.tempdir, 0o777)
        os.environ.update(HOME=entry.pw_dir, TMPDIR=tempfile.tempdir)
        os.setgroups([])
        os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
        os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
    asyncio.run(main(args.calls, args.rounds))
