"""Running a tool's process inside the walls (SPEC §4, §13): in the workspace, in the
kernel sandbox (the jail), with a minimal environment and a private scratch dir; and the
observation the model gets back. Path rules are in `paths.py`, output caps in
`outputcap.py`, the process-group runner in `process.py`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from core.tools.base import ToolContext, ToolResult
from core.tools.gitenv import neutralised
from core.tools.jail import Jail
from core.tools.process import ProcessResult, run_process
from core.tools.settings import SandboxSettings, default_temp_root


def tool_env(sandbox: SandboxSettings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a tool: allowlisted host variables plus the tool's declared env, and
    git's program-running settings overridden (`gitenv.py`)."""
    host = {key: os.environ[key] for key in sandbox.env_allowlist if key in os.environ}
    return neutralised(host, extra or {})


def format_observation(result: ProcessResult, *, timeout: float) -> ToolResult:
    """One structured observation for the model: exit code, duration, both streams and
    notes on timeouts and cut output."""
    lines: list[str] = []
    if result.timed_out:
        lines.append(f"error: timed out; the process group was killed after {timeout:g}s")
    lines += [f"exit_code: {result.exit_code}", f"duration: {result.duration:.2f}s"]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        lines.append(f"{name}:\n{text.rstrip(chr(10))}" if text else f"{name}: (empty)")
    if result.lingering_killed:
        lines.append("note: background processes kept the output open and were killed")
    if result.artifacts:
        paths = ", ".join(str(p) for p in result.artifacts)
        lines.append(
            f"note: output was cut; full output in {paths} "
            "(page through it with read_file offset/limit)"
        )
    failed = result.timed_out or result.exit_code != 0
    return ToolResult("\n".join(lines), is_error=failed, artifacts=result.artifacts)


def jail_of(ctx: ToolContext) -> Jail:
    """The context's jail, else one built from its settings (kept with them)."""
    if ctx.jail is not None:
        return ctx.jail
    jail = ctx.sandbox._cache.get("jail")
    if jail is None:
        jail = ctx.sandbox._cache["jail"] = Jail(ctx.sandbox)
    assert isinstance(jail, Jail)
    return jail


@contextlib.contextmanager
def _scratch(ctx: ToolContext) -> Iterator[Path]:
    """The run's scratch dir, or a fresh one for this call alone (removed after)."""
    if ctx.scratch is not None:
        ctx.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        yield ctx.scratch
        return
    root = default_temp_root() / "calls"
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run_in_workspace(
    argv: list[str],
    ctx: ToolContext,
    *,
    timeout: float,  # noqa: ASYNC109 - the process group's deadline, enforced by run_process
    env: Mapping[str, str] | None = None,
    read_only: bool = False,
) -> ToolResult:
    """Run `argv` in the workspace inside the kernel sandbox; the observation for the
    model. `env`: the tool's own extra variables; `read_only`: it may write nowhere but
    its scratch dir (a read-category tool)."""
    sandbox = ctx.sandbox
    workspace = sandbox.resolved_workspace()
    workspace.mkdir(parents=True, exist_ok=True)
    jail = jail_of(ctx)
    with _scratch(ctx) as scratch:
        variables = tool_env(sandbox, {**ctx.env, **(env or {})})
        variables["TMPDIR"] = str(scratch)
        if jail.enforced:  # the real home is out of reach; give tools one they can use
            variables["HOME"] = str(scratch)
        spawn = jail.prepare(scratch, read_only=read_only)
        try:
            result = await run_process(
                argv,
                cwd=ctx.cwd or workspace,
                env=variables,
                timeout=timeout,
                cap=sandbox.output_cap_bytes,
                artifacts_dir=sandbox.resolved_artifacts(),
                spawn=spawn,
            )
        finally:
            if spawn is not None:
                spawn.close()
    return format_observation(result, timeout=timeout)
