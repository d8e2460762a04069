"""Small real tools used to drive the loop (real implementations of the Tool contract),
and process checks shared by the tool tests."""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from pathlib import Path

from pydantic import BaseModel, Field

from core.tools.base import Category, Tool, ToolContext, ToolResult


class EchoArgs(BaseModel):
    text: str = Field(description="What to echo")


class EchoTool(Tool):
    name: str = "echo"
    description: str = "Echo the text back."
    category: Category = "read"
    params = EchoArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, EchoArgs)
        return ToolResult(f"echo: {args.text}")


class FailingTool(Tool):
    name: str = "explode"
    description: str = "Always raises."
    category: Category = "read"
    params = EchoArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        raise RuntimeError("disk on fire")


class SleepArgs(BaseModel):
    seconds: float


class SleepTool(Tool):
    """Sleeps; records start/end times and whether it was cancelled."""

    description: str = "Sleep a while."
    params = SleepArgs

    def __init__(self, name: str = "sleep_read", category: Category = "read") -> None:
        self.name = name
        self.category = category
        self.spans: list[tuple[float, float]] = []
        self.cancelled = 0
        self.started = asyncio.Event()

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, SleepArgs)
        start = time.perf_counter()
        self.started.set()
        try:
            await asyncio.sleep(args.seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.spans.append((start, time.perf_counter()))
        return ToolResult(f"slept {args.seconds}")


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie awaiting its reaper counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: fall back to a signal probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def pids_running(*argv: str) -> list[int]:
    """Live processes whose command line is exactly `argv`, as the host sees them (a tool
    in a PID namespace cannot tell its own pids: `$$` and `$!` are the namespace's)."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline == wanted and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_dead(pids: list[int], within: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within
    while (living := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return living


def sandbox_config_text(
    ws: Path,
    state: Path,
    *,
    tools_file: str = "tools.yaml",
    scope: str | None = None,
    tail: str = "",
) -> str:
    """A config.toml for the wall's tests: a provider nobody calls, the tools' workspace
    (and its `workspace_scope`) and state under `state`; `tail`: further sections."""
    scope_line = f'workspace_scope = "{scope}"\n' if scope is not None else ""
    return (
        textwrap.dedent(
            f"""\
            default_provider = "p"
            [providers.p]
            kind = "openai_chat"
            model = "m"
            base_url = "http://127.0.0.1:9"
            [tools]
            workspace = "{ws}"
            """
        )
        + scope_line
        + textwrap.dedent(
            f"""\
            artifacts_dir = "{state / "artifacts"}"
            tools_file = "{tools_file}"
            sandbox = "auto"
            [store]
            path = "{state / "parley.db"}"
            events_log = "{state / "events.jsonl"}"
            """
        )
        + textwrap.dedent(tail)
    )
