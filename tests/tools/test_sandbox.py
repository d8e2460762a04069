"""Path boundaries, the tool environment, output caps and the subprocess runner."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ToolDenied, ToolError
from core.messages import ToolCall
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashTool
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.sandbox import (
    ProcessResult,
    cap_output,
    mentions_denied_path,
    resolve_path,
    run_process,
    tool_env,
)
from core.tools.settings import SandboxSettings, default_temp_root
from tests.helpers import wait_dead


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    workspace = tmp_path / "ws"
    (workspace / "secrets").mkdir(parents=True)
    return SandboxSettings(
        workspace=workspace,
        artifacts_dir=tmp_path / "artifacts",
        denied_paths=[workspace / "secrets"],
        allowed_paths=[tmp_path / "extra"],
    )


# --- resolve_path ------------------------------------------------------------------------


def test_relative_paths_hang_off_the_workspace(settings: SandboxSettings) -> None:
    workspace = settings.resolved_workspace()
    assert resolve_path("notes/a.txt", settings, for_write=True) == workspace / "notes/a.txt"
    assert resolve_path(".", settings, for_write=False) == workspace


def test_tilde_expands_to_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = SandboxSettings(workspace=Path("~/ws"), denied_paths=[Path("~/.ssh")])
    assert resolve_path("~/ws/a", settings, for_write=True) == tmp_path / "home/ws/a"
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path("~/elsewhere", settings, for_write=False)


def test_dot_dot_cannot_escape(settings: SandboxSettings) -> None:
    climb = "../" * 40 + "etc/hostname"
    with pytest.raises(ToolDenied, match=f"`{climb}` resolves to /etc/hostname, which is outside"):
        resolve_path(climb, settings, for_write=False)
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path("missing/../../../x", settings, for_write=True)


def test_extra_allowed_roots_and_temp_root_are_allowed(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    assert resolve_path(str(tmp_path / "extra/f"), settings, for_write=True) == (
        tmp_path / "extra/f"
    )
    temp_file = default_temp_root() / "scratch.txt"
    assert resolve_path(str(temp_file), settings, for_write=True) == temp_file.resolve()


def test_artifacts_are_readable_not_writable(tmp_path: Path, settings: SandboxSettings) -> None:
    artifact = str(tmp_path / "artifacts" / "out.txt")
    assert resolve_path(artifact, settings, for_write=False) == Path(artifact)
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path(artifact, settings, for_write=True)


def test_denied_beats_allowed(settings: SandboxSettings) -> None:
    for path in ("secrets", "secrets/", "secrets/key", "./secrets/../secrets/key"):
        with pytest.raises(ToolDenied, match="inside the denied path"):
            resolve_path(path, settings, for_write=False)
    # A sibling that merely shares the prefix is not inside the denied directory.
    assert resolve_path("secrets-public/x", settings, for_write=True).name == "x"


def test_symlinks_are_resolved_before_checking(tmp_path: Path, settings: SandboxSettings) -> None:
    workspace = settings.resolved_workspace()
    (workspace / "to_secrets").symlink_to(workspace / "secrets")
    (workspace / "dangling").symlink_to(tmp_path / "not-yet" / "there.txt")
    (workspace / "inside").symlink_to(workspace / "secrets-public", target_is_directory=True)
    with pytest.raises(ToolDenied, match="inside the denied path"):
        resolve_path("to_secrets/key", settings, for_write=False)
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path("dangling", settings, for_write=True)
    assert resolve_path("inside/a", settings, for_write=True) == workspace / "secrets-public/a"


def test_denied_path_that_is_a_symlink_also_denies_its_target(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    workspace = settings.resolved_workspace()
    (workspace / "real-keys").mkdir()
    (workspace / "keys").symlink_to(workspace / "real-keys")
    settings.denied_paths.append(workspace / "keys")
    with pytest.raises(ToolDenied, match="denied"):
        resolve_path("real-keys/id_rsa", settings, for_write=False)


def test_symlink_loop_is_refused(settings: SandboxSettings) -> None:
    workspace = settings.resolved_workspace()
    (workspace / "loop_a").symlink_to(workspace / "loop_b")
    (workspace / "loop_b").symlink_to(workspace / "loop_a")
    with pytest.raises(ToolDenied):
        resolve_path("loop_a/x", settings, for_write=False)


@pytest.mark.parametrize(
    ("command", "denied"),
    [
        ("cat ~/.ssh/id_rsa", "home/.ssh"),
        ("tar czf keys.tgz $HOME/.ssh", "home/.ssh"),
        ("python3 -c 'open(\"${HOME}/.ssh/config\")'", "home/.ssh"),
        ("cat secrets/key", "ws/secrets"),
        ("cat ../ws/secrets/key", "ws/secrets"),
        ("ls ~/.sshx", None),
        ("cat notes/secrets.txt", None),
        ("curl https://example.com/home/.ssh", None),
        ("ls", None),
    ],
)
def test_mentions_denied_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, denied: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = SandboxSettings(
        workspace=tmp_path / "ws", denied_paths=[Path("~/.ssh"), tmp_path / "ws" / "secrets"]
    )
    found = mentions_denied_path(command, settings)
    assert found == (tmp_path / denied if denied else None)


# --- tool_env ----------------------------------------------------------------------------


def test_tool_env_keeps_only_allowlisted_and_declared(
    settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = tool_env(settings, {"KUBECONFIG": "/k", "LANG": "en_GB.UTF-8"})
    assert "OPENAI_API_KEY" not in env
    assert env["KUBECONFIG"] == "/k"
    assert env["LANG"] == "en_GB.UTF-8"  # the tool's declaration wins
    assert set(env) <= set(settings.env_allowlist) | {"KUBECONFIG"}


# --- cap_output --------------------------------------------------------------------------


def test_cap_output_keeps_short_output_whole() -> None:
    assert cap_output(b"hello\n", 1024) == ("hello\n", False, 0)


def test_cap_output_keeps_head_and_tail_with_notice(tmp_path: Path) -> None:
    data = b"H" * 600 + b"M" * 12_345 + b"T" * 600
    text, truncated, cut = cap_output(data, 1024, tmp_path / "full.txt")
    assert truncated
    assert cut == len(data) - 1024
    assert text.startswith("H" * 512)
    assert text.endswith("T" * 512)
    assert f"\n…[{cut:,} bytes cut; full output in {tmp_path / 'full.txt'}]…\n" in text


def test_cap_output_does_not_split_characters() -> None:
    text, truncated, _ = cap_output("é".encode() * 2000, 1025)
    assert truncated
    assert "\ufffd" not in text


@given(st.binary(max_size=5000), st.integers(min_value=16, max_value=3000))
def test_cap_output_is_bounded(data: bytes, cap: int) -> None:
    text, truncated, cut = cap_output(data, cap)
    assert truncated == (len(data) > cap)
    assert cut == max(0, len(data) - cap)
    notice = len("\n…[ bytes cut; full output not kept]…\n") + len(f"{cut:,}")
    assert len(text) <= cap + (notice if truncated else 0)


# --- run_process -------------------------------------------------------------------------


async def run(
    argv: list[str], tmp_path: Path, *, timeout: float = 5, cap: int = 1024
) -> ProcessResult:
    return await run_process(
        argv,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "ONLY": "this"},
        timeout=timeout,
        cap=cap,
        artifacts_dir=tmp_path / "artifacts",
    )


async def test_run_process_reports_exit_code_streams_and_env(tmp_path: Path) -> None:
    result = await run(["bash", "-c", "pwd; echo $ONLY; cat; echo bad >&2; exit 3"], tmp_path)
    assert result.exit_code == 3
    assert result.stdout == f"{tmp_path}\nthis\n"  # `cat` got EOF: stdin is closed
    assert result.stderr == "bad\n"
    assert not result.timed_out
    assert not result.truncated
    assert result.artifact is None
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_run_process_keeps_full_output_in_artifact(tmp_path: Path) -> None:
    result = await run(["seq", "1", "100000"], tmp_path, cap=4096)
    expected = "".join(f"{n}\n" for n in range(1, 100_001))
    assert result.truncated
    assert result.artifact is not None
    assert result.artifact.read_text() == expected
    assert result.stdout.startswith("1\n2\n")
    assert result.stdout.endswith("99999\n100000\n")
    assert len(result.stdout.encode()) < 4096 + 200
    assert result.artifact.parent == tmp_path / "artifacts"


async def test_run_process_missing_program_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="cannot start `no-such-program-xyz`"):
        await run(["no-such-program-xyz"], tmp_path)


async def test_run_process_timeout_kills_group(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; sleep 30"
    started = time.monotonic()
    result = await run(["bash", "-c", script], tmp_path, timeout=0.3)
    assert time.monotonic() - started < 2
    assert result.timed_out
    assert result.exit_code == -9
    assert wait_dead([int((tmp_path / "child.pid").read_text())]) == []


async def test_background_child_holding_pipes_does_not_stall(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; echo done"
    started = time.monotonic()
    result = await run(["bash", "-c", script], tmp_path, timeout=10)
    assert time.monotonic() - started < 2
    assert result.exit_code == 0
    assert result.stdout == "done\n"
    assert result.lingering_killed
    assert not result.timed_out
    assert wait_dead([int((tmp_path / "child.pid").read_text())]) == []


async def test_cancelling_run_process_kills_group(tmp_path: Path) -> None:
    script = "sleep 30 & echo $! > child.pid; echo $$ > parent.pid; wait"
    task = asyncio.create_task(run(["bash", "-c", script], tmp_path, timeout=30))
    deadline = time.monotonic() + 5
    while not (tmp_path / "parent.pid").exists() or not (tmp_path / "child.pid").exists():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # let both writes land
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pids = [int((tmp_path / f).read_text()) for f in ("child.pid", "parent.pid")]
    assert wait_dead(pids) == []
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_cut_output_names_its_artifact_in_the_result_not_only_in_the_text(
    tmp_path: Path,
) -> None:
    settings = SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", output_cap_bytes=1024
    )
    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": "seq 1 5000"}))
    message = await executor.execute(call)
    assert len(message.artifacts) == 1
    artifact = Path(message.artifacts[0])
    assert artifact.read_text().splitlines()[-1] == "5000"  # the full output
    assert str(artifact) in message.content
