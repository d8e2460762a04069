"""Path boundaries: where file tools may go, and denied paths a command line names."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from core.errors import ToolDenied
from core.sandbox.paths import _kernel_realpath, mentions_denied_path, resolve_path
from core.sandbox.settings import SandboxSettings, default_temp_root
from core.sandbox.site import site_for


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


def test_extra_allowed_roots_and_the_runs_own_temp_dir_are_allowed(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    assert resolve_path(str(tmp_path / "extra/f"), settings, for_write=True) == (
        tmp_path / "extra/f"
    )
    scratch = default_temp_root() / "runs" / "r1"
    site = site_for(settings, "slack:C1:t", scratch)
    temp_file = scratch / "scratch.txt"
    assert resolve_path(str(temp_file), settings, for_write=True, site=site) == (
        temp_file.resolve()
    )
    # Not the temp root: it holds every other run's dir.
    for other in (default_temp_root() / "scratch.txt", default_temp_root() / "runs/r2/x"):
        with pytest.raises(ToolDenied, match="outside the allowed roots"):
            resolve_path(str(other), settings, for_write=False, site=site)


def test_artifacts_are_readable_not_writable(tmp_path: Path, settings: SandboxSettings) -> None:
    site = site_for(settings, "slack:C1:t")
    artifact = str(site.artifacts / "out.txt")
    assert resolve_path(artifact, settings, for_write=False, site=site) == Path(artifact)
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path(artifact, settings, for_write=True, site=site)
    other = site_for(settings, "slack:C2:t").artifacts / "out.txt"  # another conversation's
    with pytest.raises(ToolDenied, match="outside the allowed roots"):
        resolve_path(str(other), settings, for_write=False, site=site)


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


def test_the_kernels_answer_is_realpaths(tmp_path: Path) -> None:
    """`resolve_path` asks the kernel (O_PATH and /proc/self/fd) what realpath would
    answer: through directory and file links, relative links and `..`; a missing, looping
    or not-a-directory path fails as realpath's strict mode does."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "real" / "deep" / "f.txt").write_text("x")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "rel").symlink_to("deep/f.txt")
    (tmp_path / "chain").symlink_to(tmp_path / "dirlink" / "rel")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("real/deep/f.txt", "dirlink/deep", "dirlink/rel", "chain", "real/deep/../rel"):
        path = str(tmp_path / name)
        assert _kernel_realpath(path) == os.path.realpath(path, strict=True), name
    for name, code in [
        ("nowhere", errno.ENOENT),
        ("dangling", errno.ENOENT),
        ("loop", errno.ELOOP),
        ("chain/x", errno.ENOTDIR),
    ]:
        for resolve in (_kernel_realpath, lambda p: os.path.realpath(p, strict=True)):
            with pytest.raises(OSError, match=os.strerror(code)):
                resolve(str(tmp_path / name))
