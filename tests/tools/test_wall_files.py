"""The built-in file tools and the places of a run, tried as an attacker would: one
conversation's tools going after another's live scratch dir, its cut outputs and its
workspace through the real tools (`ToolExecutor` with `builtin_tools`), by path, by a
symlink planted in their own workspace, by `..` and by `/proc/self/root`; and the
kernel's rules on the file tools' own thread, with the path checks out of the way.

Under `PARLEY_REQUIRE_SANDBOX=1` (CI) a kernel without Landlock fails these tests instead
of skipping them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.messages import Message, ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings, default_temp_root
from core.sandbox.site import site_for
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import file_jail_of, release_site
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.process import REPO

A_SCRATCH_SECRET = "A-SCRATCH-SECRET"
A_ARTIFACT_SECRET = "A-ARTIFACT-SECRET"
A_WORKSPACE_SECRET = "A-WORKSPACE-SECRET"


pytestmark = pytest.mark.usefixtures("landlock_required")


@dataclass
class Conv:
    """One conversation's run: its own executor (as the agent gives each conversation)
    and its own RunContext (conversation id, live scratch dir under the temp root)."""

    executor: ToolExecutor
    run: RunContext

    @property
    def site(self) -> Any:
        assert self.run.site is not None
        return self.run.site

    async def call(self, tool: str, **args: Any) -> Message:
        call = ToolCall(id=uuid.uuid4().hex[:8], name=tool, arguments=json.dumps(args))
        return await self.executor.execute(call, self.run)


def open_conv(settings: SandboxSettings, conv: str) -> Conv:
    scratch = default_temp_root() / "runs" / f"test-{uuid.uuid4().hex[:12]}"
    site = site_for(settings, conv, scratch)
    executor = ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))
    return Conv(executor, RunContext(run_id=scratch.name, conv=conv, scratch=scratch, site=site))


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(
        workspace=tmp_path / "ws",
        artifacts_dir=tmp_path / "artifacts",
        output_cap_bytes=1024,  # so a few KB of output makes an artifact
        default_timeout=20,
    )


@pytest.fixture
async def a_and_b(settings: SandboxSettings) -> AsyncIterator[tuple[Conv, Conv, Path]]:
    """Conversation A (channel CA) has a live scratch dir holding a secret and a cut
    output holding another; conversation B (channel CB) is the attacker. Yields A, B
    and the path of A's artifact."""
    a, b = open_conv(settings, "slack:CA:1"), open_conv(settings, "slack:CB:1")
    made = await a.call(
        "bash",
        command=(
            f'echo {A_SCRATCH_SECRET} > "$TMPDIR/secret.txt"; '
            f"echo {A_WORKSPACE_SECRET} > notes.txt; "
            f"for i in $(seq 400); do echo {A_ARTIFACT_SECRET}; done"
        ),
    )
    assert made.artifacts, made.content
    artifact = Path(made.artifacts[0])
    assert artifact.parent == a.site.artifacts
    assert A_SCRATCH_SECRET in (a.site.scratch / "secret.txt").read_text()
    try:
        yield a, b, artifact
    finally:
        for conv in (a, b):
            release_site(conv.site)
            shutil.rmtree(conv.site.scratch, ignore_errors=True)


def _no_secret(message: Message) -> None:
    for secret in (A_SCRATCH_SECRET, A_ARTIFACT_SECRET, A_WORKSPACE_SECRET):
        assert secret not in message.content, message.content
    assert message.is_error, message.content


def _targets(a: Conv, artifact: Path) -> Iterator[tuple[str, Path]]:
    """(what, path) pairs of A's that B goes after."""
    yield "scratch file", a.site.scratch / "secret.txt"
    yield "scratch dir", a.site.scratch
    yield "runs dir", a.site.scratch.parent
    yield "artifact", artifact
    yield "artifacts dir", a.site.artifacts
    yield "workspace file", a.site.workspace / "notes.txt"


async def test_b_cannot_read_or_list_as_by_path(a_and_b: tuple[Conv, Conv, Path]) -> None:
    a, b, artifact = a_and_b
    for _what, target in _targets(a, artifact):
        tool = "list_directory" if target.is_dir() else "read_file"
        _no_secret(await b.call(tool, path=str(target)))
        _no_secret(await b.call(tool, path=f"/proc/self/root{target}"))
        climb = os.path.relpath(target, b.site.workspace)
        assert climb.startswith("..")
        _no_secret(await b.call(tool, path=climb))


async def test_b_cannot_read_list_or_write_through_a_symlink_in_its_workspace(
    a_and_b: tuple[Conv, Conv, Path],
) -> None:
    a, b, artifact = a_and_b
    for number, (_what, target) in enumerate(_targets(a, artifact)):
        planted = await b.call("bash", command=f"ln -s {target} link{number}")
        assert not planted.is_error, planted.content
        tool = "list_directory" if target.is_dir() else "read_file"
        _no_secret(await b.call(tool, path=f"link{number}"))
    for number, (_what, target) in enumerate(_targets(a, artifact)):
        if target.is_dir():
            _no_secret(await b.call("write_file", path=f"link{number}/planted.txt", content="x"))
            assert not (target / "planted.txt").exists()
    before = (a.site.scratch / "secret.txt").read_text()
    _no_secret(await b.call("write_file", path="link0", content="overwritten"))
    assert (a.site.scratch / "secret.txt").read_text() == before


async def test_b_cannot_write_into_as_scratch_or_artifacts(
    a_and_b: tuple[Conv, Conv, Path],
) -> None:
    a, b, _artifact = a_and_b
    for where in (a.site.scratch, a.site.artifacts, a.site.workspace):
        for spelling in (str(where / "planted.txt"), f"/proc/self/root{where}/planted.txt"):
            _no_secret(await b.call("write_file", path=spelling, content="planted"))
        assert not (where / "planted.txt").exists()


async def test_a_reads_its_own_scratch_and_artifact_with_read_file_and_bash(
    a_and_b: tuple[Conv, Conv, Path],
) -> None:
    a, _b, artifact = a_and_b
    assert (
        A_SCRATCH_SECRET
        in (await a.call("read_file", path=str(a.site.scratch / "secret.txt"))).content
    )
    assert A_ARTIFACT_SECRET in (await a.call("read_file", path=str(artifact))).content
    assert artifact.name in (await a.call("list_directory", path=str(a.site.artifacts))).content
    cat = await a.call("bash", command=f"head -n 2 {artifact}")
    assert A_ARTIFACT_SECRET in cat.content, cat.content
    # Read, never changed: the artifacts are Parley's record of what the tool printed.
    changed = await a.call("bash", command=f"echo forged > {artifact}; rm -f {artifact}")
    assert artifact.exists(), changed.content
    assert A_ARTIFACT_SECRET in artifact.read_text(), changed.content
    refused = await a.call("write_file", path=str(artifact), content="forged")
    assert refused.is_error
    assert A_ARTIFACT_SECRET in artifact.read_text()


async def test_a_cut_output_made_after_the_runs_first_file_call_is_readable(
    settings: SandboxSettings,
) -> None:
    conv = open_conv(settings, "slack:CC:1")
    try:
        assert not (await conv.call("list_directory", path=".")).is_error  # thread confined
        made = await conv.call("bash", command="seq 2000; echo $TMPDIR > where.txt")
        [artifact] = made.artifacts
        read = await conv.call("read_file", path=artifact, offset=1990)
        assert "2000" in read.content, read.content
        temp = await conv.call("list_directory", path=str(conv.site.scratch))
        assert not temp.is_error, temp.content
    finally:
        release_site(conv.site)


async def test_bs_bash_cannot_read_as_artifacts_or_scratch(
    a_and_b: tuple[Conv, Conv, Path],
) -> None:
    a, b, artifact = a_and_b
    for command in (
        f"cat {artifact}",
        f"cat {a.site.artifacts}/*",
        f"ls {a.site.artifacts}",
        f"cat {a.site.scratch}/secret.txt",
        f"cat /proc/self/root{artifact}",
        f"ln -s {artifact} l && cat l",
        f"cd {a.site.artifacts.parent} && cat */*",
        f"cat {a.site.workspace}/notes.txt",
    ):
        _no_secret(await b.call("bash", command=command))


async def test_the_file_thread_itself_is_held_by_the_kernel(
    a_and_b: tuple[Conv, Conv, Path], tmp_path: Path
) -> None:
    # The path checks out of the way: B's file thread opens A's files directly, as a
    # symlink swapped in between check and open would make it do.
    a, b, artifact = a_and_b
    files = file_jail_of(ToolContext(b.executor.ctx.sandbox, site=b.site))
    assert files.confined
    for _what, target in _targets(a, artifact):
        with pytest.raises(PermissionError):
            await files.run(lambda t=target: os.listdir(t) if t.is_dir() else t.read_text())
    with pytest.raises(PermissionError):
        await files.run((a.site.scratch / "dropped.txt").write_text, "x")
    outside = tmp_path / "outside.txt"  # beside the workspace root, in no root
    outside.write_text("not for tools")
    for private in (outside, Path("/proc/1/environ")):
        with pytest.raises(PermissionError):
            await files.run(private.read_bytes)
    assert "hostname" in "".join(await files.run(os.listdir, "/etc"))


# --- workspace_scope -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "same"),
    [
        ("channel", [("slack:C1:t1", "slack:C1:t2")]),
        ("conversation", []),
        ("shared", []),  # everyone
    ],
)
async def test_workspace_scope_separates_channels(
    tmp_path: Path, scope: str, same: list[tuple[str, str]]
) -> None:
    settings = SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", workspace_scope=scope
    )  # type: ignore[arg-type]
    names = ("slack:C1:t1", "slack:C1:t2", "discord:C9:")
    convs = {name: open_conv(settings, name) for name in names}
    files = {name: f"mine-{number}.txt" for number, name in enumerate(names)}
    try:
        for name, conv in convs.items():
            wrote = await conv.call("write_file", path=files[name], content=f"{name}\n")
            assert not wrote.is_error, wrote.content
        for one, other in [(x, y) for x in names for y in names if x != y]:
            shared = scope == "shared" or (one, other) in same or (other, one) in same
            there = convs[other].site.workspace / files[other]
            seen = [
                await convs[one].call("read_file", path=str(there)),
                await convs[one].call("read_file", path=files[other]),
                await convs[one].call("bash", command=f"cat {there}"),
            ]
            for message in seen:
                assert (other in message.content) == shared, (scope, one, other, message)
            listing = await convs[one].call("list_directory", path=".")
            assert (files[other] in listing.content) == shared, listing.content
        if scope == "shared":
            assert {c.site.workspace for c in convs.values()} == {settings.resolved_workspace()}
        else:
            workspaces = {c.site.workspace.name for c in convs.values()}
            assert len(workspaces) == (2 if scope == "channel" else 3)
            assert all(w.startswith(("slack-C1", "discord-C9")) for w in workspaces), workspaces
    finally:
        for conv in convs.values():
            release_site(conv.site)


async def test_status_and_the_prompt_name_the_channels_workspace(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "pwd > where.txt"})]), Reply("ok")
    )
    async with running_agent(fake_llm, tmp_path, tools={"workspace_scope": "channel"}) as agent:
        chat = RecordingResponder()
        await agent.submit(inbound("where are you?", key=("test", "c1", "")), chat)
        await agent.wait_idle()
        await agent.submit(inbound("/status", key=("test", "c1", "")), chat)
        status = chat.sent[-1]
    [workspace] = (tmp_path / "workspace").iterdir()
    assert workspace.name.startswith("test-c1-")
    assert (workspace / "where.txt").read_text().strip() == str(workspace)
    assert f"Workspace: {workspace} (channel test:c1)" in status
    system = fake_llm.requests[0].json["messages"][0]["content"]
    assert f"working directory {workspace}" in system


# --- as an ordinary user ---------------------------------------------------------------------

_PROBE = r"""
import asyncio, json, os, sys
import concurrent.futures.thread  # the ordinary user may not read Python's own files
from pathlib import Path
from core.messages import ToolCall
from core.run_context import RunContext
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.sandbox.settings import SandboxSettings, default_temp_root
from core.sandbox.site import site_for

base, become = Path(sys.argv[1]), int(sys.argv[2])
if become:
    os.setgroups([])
    os.setresgid(become, become, become)
    os.setresuid(become, become, become)
settings = SandboxSettings(workspace=base / "ws", artifacts_dir=base / "art")

async def main():
    runs = {}
    for conv in ("slack:CA:1", "slack:CB:1"):
        scratch = default_temp_root() / "runs" / conv.replace(":", "_")
        site = site_for(settings, conv, scratch)
        executor = ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))
        runs[conv] = (executor, RunContext(conv=conv, scratch=scratch, site=site), site)
    async def call(conv, tool, **args):
        executor, run, _ = runs[conv]
        call = ToolCall(id="c", name=tool, arguments=json.dumps(args))
        message = await executor.execute(call, run)
        return message.content
    await call("slack:CA:1", "bash", command='echo A-SECRET > "$TMPDIR/s.txt"')
    secret = runs["slack:CA:1"][2].scratch / "s.txt"
    await call("slack:CB:1", "bash", command=f"ln -s {secret} link")
    out = [await call("slack:CB:1", "read_file", path=p) for p in (str(secret), "link")]
    out.append(await call("slack:CA:1", "read_file", path=str(secret)))
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.parametrize("user", ["root", "ordinary user"])
async def test_the_file_walls_hold_for_root_and_an_ordinary_user(user: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching between root and an ordinary user needs root")
    become = 0
    if user != "root":
        import pwd

        try:
            become = pwd.getpwnam("parleytest").pw_uid
        except KeyError:
            pytest.skip("no user `parleytest`")
    holder = tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-files-")
    base = Path(holder.name)
    os.chmod(base, 0o777)
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(base), "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", textwrap.dedent(_PROBE), str(base), str(become),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    holder.cleanup()
    text = out.decode()
    *_, last = text.strip().splitlines()
    b_by_path, b_by_link, a_own = json.loads(last)
    assert "A-SECRET" not in b_by_path, text
    assert "A-SECRET" not in b_by_link, text
    assert "A-SECRET" in a_own, text


def test_the_inline_read_opens_exactly_the_checked_path(tmp_path: Path) -> None:
    """`read_file` reads a small file on the event loop only when the kernel opens exactly
    the path the rules checked: a symlink anywhere on the way (swapped in after the check),
    a /proc magic link, a FIFO or a file with another name goes to the confined thread."""
    from core.tools.builtin import _read_inline

    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "plain.txt").write_text("one\ntwo\n")
    (ws / "link.txt").symlink_to(secret)
    (ws / "dir").symlink_to(tmp_path)
    os.link(secret, ws / "hard.txt")
    os.mkfifo(ws / "fifo")
    assert _read_inline(ws / "plain.txt", 1, 10, 1000) == (b"one\ntwo\n", 2, 2)
    for path in (
        ws / "link.txt",
        ws / "dir" / "secret.txt",
        Path(f"/proc/self/root{secret}"),
        Path(f"/proc/{os.getpid()}/cwd/{secret.relative_to('/')}"),
        ws / "hard.txt",
        ws / "fifo",
    ):
        assert _read_inline(path, 1, 10, 1000) is None, path
