"""git's program-running configuration is overridden in every tool process, tried as the
attacker did: a repository (written by a tool, as a model steered by a web page would)
whose `.git/config` and an included file name a planted script as fsmonitor, pager, gpg
program, credential helper and hooks dir, with signatures shown by default. Then the
shipped read-only `git_log` tool and `bash` (`git log`, `git status`, `git commit`, …) run
in it. The script would say so on stderr and leave a marker; neither may happen."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.messages import ToolCall
from core.run_context import RunContext
from core.sandbox.gitenv import GIT_ENV
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashTool
from core.tools.cli import load_cli_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import tool_env

SHIPPED_TOOLS = Path(__file__).parents[2] / "tools.yaml"

# Step one, run through `bash` like any model command: a repository, a signed-looking
# commit (so that showing signatures calls the gpg program), a script, and configuration
# that names it, appended to the files directly (a file write no text check can judge).
PLANT = r"""
set -e
mkdir repo && cd repo
git init -q
git config user.email a@example.com && git config user.name a
echo one > f && git add f && git commit -qm one
tree=$(git write-tree)
{
  echo "tree $tree" && echo "parent $(git rev-parse HEAD)"
  echo "author a <a@example.com> 1700000000 +0000"
  echo "committer a <a@example.com> 1700000000 +0000"
  printf 'gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n'
  printf ' -----END PGP SIGNATURE-----\n'
  printf '\nsigned\n'
} > commit.txt
git update-ref HEAD "$(git hash-object -t commit -w --stdin < commit.txt)"
cat > evil.sh <<'EOF'
#!/bin/sh
echo "PLANTED-RAN $*" >&2
echo "ran $*" >> "$(dirname "$0")/MARKER"
EOF
chmod +x evil.sh
mkdir hooks && cp evil.sh hooks/pre-commit && cp evil.sh hooks/post-commit
cp evil.sh .git/hooks/pre-commit
cat >> .git/config <<EOF
[core]
	fsmonitor = $PWD/evil.sh
	hooksPath = $PWD/hooks
[include]
	path = $PWD/planted.cfg
EOF
cat > planted.cfg <<EOF
[core]
	pager = $PWD/evil.sh
	editor = $PWD/evil.sh
	askPass = $PWD/evil.sh
	sshCommand = $PWD/evil.sh
	gitProxy = $PWD/evil.sh
[pager]
	log = $PWD/evil.sh
[gpg]
	program = $PWD/evil.sh
[log]
	showSignature = true
[commit]
	gpgSign = true
[credential]
	helper = !$PWD/evil.sh
EOF
echo planted
"""

# Step two: what an unsuspecting model runs next.
INNOCENT_BASH = [
    "cd repo && git log",
    "cd repo && git log --show-signature -n 1",
    "cd repo && git status",
    "cd repo && echo two >> f && git diff",
    "cd repo && git show --stat HEAD",
    "cd repo && git commit -qam two",
    "cd repo && printf 'protocol=https\\nhost=example.com\\n\\n' | git credential fill",
    "cd repo && git ls-remote git://127.0.0.1:9/x",
]


@pytest.fixture
def settings() -> Iterator[SandboxSettings]:
    # Beside pytest's tmp_path, whose parents the tools' user (`nobody` under root) cannot
    # enter, so git could not even find the repository.
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-git-") as holder:
        base = Path(holder)
        base.chmod(0o755)
        yield SandboxSettings(workspace=base / "ws", artifacts_dir=base / "art")


def _executor(settings: SandboxSettings) -> ToolExecutor:
    tools = [BashTool(), *load_cli_tools(SHIPPED_TOOLS, environ={})]
    return ToolExecutor(ToolRegistry(tools), ToolPolicy(), ToolContext(settings))


async def _call(executor: ToolExecutor, name: str, **arguments: object) -> str:
    async def approver(tool: str, summary: str, reason: str) -> bool:
        raise AssertionError(f"an innocent command needed an approver: {reason}")

    call = ToolCall(id="c", name=name, arguments=json.dumps(arguments))
    return (await executor.execute(call, RunContext(approver=approver))).content


async def _planted(settings: SandboxSettings) -> tuple[ToolExecutor, Path]:
    executor = _executor(settings)
    output = await _call(executor, "bash", command=PLANT, timeout=60)
    assert "planted" in output, output
    return executor, settings.resolved_workspace() / "repo"


async def test_the_shipped_git_log_tool_runs_no_planted_program(
    settings: SandboxSettings,
) -> None:
    executor, repo = await _planted(settings)
    output = await _call(executor, "git_log", repo="repo", count=5)
    assert "signed" in output, output  # it worked, and showed the planted commit
    assert "PLANTED-RAN" not in output, output
    assert not (repo / "MARKER").exists()


@pytest.mark.parametrize("command", INNOCENT_BASH)
async def test_bash_git_runs_no_planted_program(settings: SandboxSettings, command: str) -> None:
    executor, repo = await _planted(settings)
    output = await _call(executor, "bash", command=command)
    assert "PLANTED-RAN" not in output, output
    marker = repo / "MARKER"
    assert not marker.exists(), marker.read_text()


async def test_git_still_does_its_work(settings: SandboxSettings) -> None:
    executor, _ = await _planted(settings)
    output = await _call(executor, "bash", command="cd repo && echo two >> f && git diff")
    assert "+two" in output, output
    output = await _call(executor, "bash", command="cd repo && git commit -qam two && git log")
    assert "exit_code: 0" in output, output
    assert "    two" in output, output


async def test_host_variables_that_run_programs_do_not_reach_tools(
    settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor, repo = await _planted(settings)
    evil = repo / "evil.sh"
    planted = {
        "GIT_EXTERNAL_DIFF": str(evil),
        "GIT_CONFIG_PARAMETERS": f"'core.fsmonitor'='{evil}'",
        "GIT_CONFIG_GLOBAL": str(repo / "planted.cfg"),
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    settings.env_allowlist += list(planted)  # even an operator's allowlist does not pass them
    output = await _call(executor, "bash", command="cd repo && echo x >> f && git diff")
    assert "+x" in output, output
    assert "PLANTED-RAN" not in output, output
    assert not (repo / "MARKER").exists()


def test_a_tools_own_env_cannot_undo_the_overrides(settings: SandboxSettings) -> None:
    env = tool_env(settings, {"GIT_CONFIG_COUNT": "0", "GIT_CONFIG_GLOBAL": "/x", "A": "1"})
    assert env["GIT_CONFIG_COUNT"] == GIT_ENV["GIT_CONFIG_COUNT"]
    assert env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert env["A"] == "1"
