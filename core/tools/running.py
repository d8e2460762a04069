"""Running a tool's process inside the wall (docs/tools.md, docs/architecture.md): in the
run's workspace, in the kernel sandbox (`core.sandbox`: the jail, the process runner,
quotas, the file tools' confined thread), with a minimal environment, a private scratch
dir and a write quota; and the observation the model gets back. The catalogue's side of
the line: a `ToolContext` in, a `ToolResult` out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from core.sandbox import (
    FileJail,
    Jail,
    PathRules,
    ProcessResult,
    SandboxSettings,
    ToolSite,
    call_quota,
    default_temp_root,
    file_jail,
    neutralised,
    prepare_site,
    release,
    run_process,
    site_for,
    tree_bytes,
    usage_of,
)
from core.tools.base import ToolContext, ToolResult


def tool_env(sandbox: SandboxSettings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a tool: allowlisted host variables plus the tool's declared env, and
    git's program-running settings overridden (`gitenv.py`)."""
    host = {key: os.environ[key] for key in sandbox.env_allowlist if key in os.environ}
    return neutralised(host, extra or {})


def format_observation(
    result: ProcessResult, *, timeout: float, quota_error: str | None = None
) -> ToolResult:
    """One structured observation for the model: exit code, duration, both streams and
    notes on timeouts, write quotas and cut output."""
    lines: list[str] = []
    if quota_error is not None:
        lines.append(f"error: {quota_error}")
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
    failed = result.timed_out or result.exit_code != 0 or quota_error is not None
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


def site_of(ctx: ToolContext) -> ToolSite:
    """Where the call's tools work: the run's site, else the workspace root (a call
    outside any conversation)."""
    return ctx.site or site_for(ctx.sandbox, "", ctx.scratch)


def file_jail_of(ctx: ToolContext) -> FileJail:
    """The confined thread and path rules of the call's run, for the file tools."""
    return file_jail(jail_of(ctx), ctx.sandbox, site_of(ctx))


def release_site(site: ToolSite) -> None:
    """The run at `site` ended: close its file tools' thread, and remove its scratch dir
    on a worker thread, crediting its bytes back to the conversation's write quota."""
    release(site)
    scratch = site.scratch
    if scratch is None or not scratch.exists():
        return
    usage = usage_of(site)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # outside the event loop (a test's teardown): do it here
        usage.charge(-tree_bytes(scratch))
        shutil.rmtree(scratch, ignore_errors=True)
        return

    def clear() -> int:
        held = tree_bytes(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        return held

    def credit(done: asyncio.Future[int]) -> None:
        if not done.cancelled() and done.exception() is None:
            usage.charge(-done.result())

    loop.run_in_executor(None, clear).add_done_callback(credit)


@contextlib.contextmanager
def _scratch(site: ToolSite) -> Iterator[Path]:
    """The run's scratch dir, or a fresh one for this call alone (removed after)."""
    if site.scratch is not None:
        yield site.scratch
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
    site = site_of(ctx)
    prepare_site(site)
    jail = jail_of(ctx)
    with _scratch(site) as scratch:
        variables = tool_env(sandbox, {**ctx.env, **(env or {})})
        variables["TMPDIR"] = str(scratch)
        if jail.enforced:  # the real home is out of reach; give tools one they can use
            variables["HOME"] = str(scratch)
        # Everything the process may write: the site's roots, and this call's own scratch.
        roots = list(dict.fromkeys((scratch, *PathRules.of(sandbox, site).write_roots)))
        quota = call_quota(sandbox, site, roots)
        spawn = jail.prepare(
            scratch,
            workspace=site.workspace,
            artifacts=site.artifacts,
            max_file_bytes=quota.file_limit,
            read_only=read_only,
        )
        try:
            result = await run_process(
                argv,
                cwd=ctx.cwd or site.workspace,
                env=variables,
                timeout=timeout,
                cap=sandbox.output_cap_bytes,
                artifacts_dir=site.artifacts,
                spawn=spawn,
                quota=quota,
            )
        finally:
            if spawn is not None:
                spawn.close()
        await quota.settle()
    return format_observation(result, timeout=timeout, quota_error=quota.exceeded)
