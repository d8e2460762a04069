"""Write quotas, tried as an attacker would through the real tools (`ToolExecutor` with
`builtin_tools`, a conversation's run): many files each just under the file-size cap,
a flood of output, one file past the budget, a conversation filling its cap call by
call.

Under `PARLEY_REQUIRE_SANDBOX=1` (CI) a kernel without Landlock fails these tests instead
of skipping them (the per-file limit is set on the sandboxed child)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.messages import Message, ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings, default_temp_root
from core.sandbox.site import ToolSite, site_for
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import release_site

MB = 1_000_000


pytestmark = pytest.mark.usefixtures("landlock_required")


class Conv:
    """A conversation's run through the real executor."""

    def __init__(self, settings: SandboxSettings, conv: str = "slack:CQ:1") -> None:
        scratch = default_temp_root() / "runs" / f"quota-{uuid.uuid4().hex[:12]}"
        self.site: ToolSite = site_for(settings, conv, scratch)
        self.run = RunContext(run_id=scratch.name, conv=conv, scratch=scratch, site=self.site)
        registry = ToolRegistry(builtin_tools())
        self.executor = ToolExecutor(registry, ToolPolicy(), ToolContext(settings))

    async def call(self, tool: str, **args: Any) -> Message:
        call = ToolCall(id=uuid.uuid4().hex[:8], name=tool, arguments=json.dumps(args))
        return await self.executor.execute(call, self.run)

    async def bash(self, command: str) -> Message:
        return await self.call("bash", command=command)

    def close(self) -> None:
        release_site(self.site)
        shutil.rmtree(self.site.scratch or "/nonexistent", ignore_errors=True)


def conv_of(tmp_path: Path, **caps: Any) -> Iterator[Conv]:
    settings = SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", default_timeout=60, **caps
    )
    conv = Conv(settings)
    try:
        yield conv
    finally:
        conv.close()


def held(directory: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in directory.glob(pattern) if p.is_file())


@pytest.fixture
def small_caps(tmp_path: Path) -> Iterator[Conv]:
    """A 4 MB file cap, a 10 MB call cap."""
    yield from conv_of(tmp_path, max_file_bytes=4 * MB, max_call_write_bytes=10 * MB)


async def test_six_files_just_under_the_file_cap_are_stopped_at_the_call_cap(
    small_caps: Conv,
) -> None:
    conv = small_caps
    result = await conv.bash(
        "for i in 1 2 3 4 5 6; do head -c 3999000 /dev/zero > f$i; done; echo finished"
    )
    assert result.is_error, result.content
    assert "write quota" in result.content
    assert "tools.max_call_write_bytes" in result.content


async def test_a_steady_writer_is_stopped_during_the_call(small_caps: Conv) -> None:
    conv = small_caps
    result = await conv.bash(
        "for i in $(seq 40); do head -c 1000000 /dev/zero > g$i; sleep 0.05; done; echo finished"
    )
    assert result.is_error, result.content
    assert "write quota" in result.content
    assert "finished" not in result.content  # killed, not told afterwards
    written = sorted(conv.site.workspace.glob("g*"))
    assert len(written) < 40
    assert held(conv.site.workspace, "g*") < 10 * MB + 5 * MB  # a few samples' overshoot


async def test_one_file_past_the_budget_ends_the_call_with_the_quota_error(
    tmp_path: Path,
) -> None:
    # The file-size limit is lowered to the budget (the kernel cuts the file there, unless
    # the shell forks before the limit lands: limits are set just after the start).
    for conv in conv_of(tmp_path, max_call_write_bytes=2 * MB):
        result = await conv.bash("head -c 5000000 /dev/zero > big; echo rc=$?")
        assert result.is_error
        assert "write quota" in result.content, result.content
        assert "tools.max_call_write_bytes" in result.content


async def test_100_mb_of_output_keeps_an_artifact_no_larger_than_the_cap(
    tmp_path: Path,
) -> None:
    for conv in conv_of(tmp_path, max_call_write_bytes=5 * MB):
        result = await conv.bash("head -c 100000000 /dev/zero | tr '\\0' x")
        [artifact] = result.artifacts
        assert Path(artifact).parent == conv.site.artifacts
        assert Path(artifact).stat().st_size <= 5 * MB
        assert "write quota reached" in result.content
        assert held(conv.site.artifacts) <= 5 * MB


async def test_the_conversation_cap_deletes_its_oldest_artifacts_first(tmp_path: Path) -> None:
    caps = {"max_conversation_write_bytes": 3 * MB, "max_call_write_bytes": 1_500_000}
    for conv in conv_of(tmp_path, **caps):
        artifacts = []
        for number in range(4):
            result = await conv.bash(f"yes out-{number} | head -c 1200000")
            assert not result.is_error, result.content
            [artifact] = result.artifacts
            artifacts.append(Path(artifact))
            assert held(conv.site.artifacts) <= 3 * MB
        kept = [path.exists() for path in artifacts]
        assert kept[-1]
        assert not kept[0]  # the oldest went first
        assert kept.index(True) == kept.count(False)  # every deleted one older than every kept


async def test_the_conversation_cap_counts_tool_writes_and_deleting_frees_them(
    tmp_path: Path,
) -> None:
    caps = {"max_conversation_write_bytes": 4 * MB, "max_call_write_bytes": 3 * MB}
    for conv in conv_of(tmp_path, **caps):
        first = await conv.bash("head -c 2500000 /dev/zero > one")
        assert not first.is_error, first.content
        second = await conv.bash("head -c 2500000 /dev/zero > two")
        assert second.is_error
        assert "tools.max_conversation_write_bytes" in second.content
        freed = await conv.bash("rm one two")
        assert not freed.is_error, freed.content
        third = await conv.bash("head -c 2500000 /dev/zero > three")
        assert not third.is_error, third.content


async def test_write_file_past_a_cap_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    caps = {"max_conversation_write_bytes": 3 * MB, "max_call_write_bytes": 2 * MB}
    for conv in conv_of(tmp_path, **caps):
        big = await conv.call("write_file", path="big.txt", content="x" * (2 * MB + 1))
        assert big.is_error
        assert "tools.max_call_write_bytes" in big.content
        assert not (conv.site.workspace / "big.txt").exists()
        for name in ("a.txt", "b.txt"):
            await conv.call("write_file", path=name, content="x" * (1_400_000))
        third = await conv.call("write_file", path="c.txt", content="x" * 400_000)
        assert third.is_error
        assert "tools.max_conversation_write_bytes" in third.content
        assert not (conv.site.workspace / "c.txt").exists()
        # Replacing a file with a smaller one frees room.
        smaller = await conv.call("write_file", path="a.txt", content="x")
        assert not smaller.is_error, smaller.content
        fits = await conv.call("write_file", path="c.txt", content="x" * 400_000)
        assert not fits.is_error, fits.content
