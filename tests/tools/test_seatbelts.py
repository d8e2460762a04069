"""The checks Parley makes before a tool runs, tried as an attacker would: option
injection through part of an argument, hard links to denied files, and a tools.yaml
`env:` value on its way to the model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bot.app import App, build_registry
from bot.config import parse_config
from core.messages import ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

GIT_LOG = """
tools:
  - name: git_log
    description: "Commits since a ref."
    category: read
    cmd: git
    args: ["log", "--oneline", "{{ref}}..HEAD"]
    parameters:
      ref: {type: string, description: "A ref"}
  - name: grep_for
    description: "Search for a pattern."
    category: read
    cmd: grep
    args: ["-r", "-e", "{{pattern}}", "."]
    parameters:
      pattern: {type: string, allow_leading_dash: true}
  - name: show_token
    description: "Print the deploy token."
    category: read
    cmd: sh
    args: ["-c", "echo token=$DEPLOY_TOKEN; echo done"]
    env: {DEPLOY_TOKEN: "${DEPLOY_TOKEN}"}
"""
TOKEN = "dpl-7c1e2f9a0b3d4e5f"


def _app(tmp_path: Path) -> App:
    (tmp_path / "tools.yaml").write_text(GIT_LOG)
    config = parse_config(
        {
            "default_provider": "p",
            "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
            "tools": {
                "workspace": str(tmp_path / "ws"),
                "artifacts_dir": str(tmp_path / "art"),
                "tools_file": str(tmp_path / "tools.yaml"),
            },
            "store": {"path": str(tmp_path / "parley.db")},
        }
    )
    environ = {"DEPLOY_TOKEN": TOKEN}
    return App(config, environ, build_registry(config, environ))


async def _call(app: App, name: str, **arguments: object) -> str:
    executor = app.conversation("p", None).executor
    call = ToolCall(id="c1", name=name, arguments=json.dumps(arguments))
    return (await executor.execute(call)).content


@pytest.mark.parametrize(
    "ref", ["--output=/tmp/parley-x", "-p", "--exec=touch pwned", "-c core.pager=touch x"]
)
async def test_a_leading_dash_inside_a_template_argument_is_refused(
    tmp_path: Path, ref: str
) -> None:
    app = _app(tmp_path)
    output = await _call(app, "git_log", ref=ref)
    assert "must not start with '-'" in output
    assert not Path("/tmp/parley-x").exists()
    await app.aclose()


async def test_a_parameter_may_opt_in_to_a_leading_dash(tmp_path: Path) -> None:
    app = _app(tmp_path)
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "f.txt").write_text("a -v flag\n")
    output = await _call(app, "grep_for", pattern="-v flag")
    assert "a -v flag" in output
    await app.aclose()


async def test_a_tools_yaml_env_value_never_reaches_the_model(tmp_path: Path) -> None:
    app = _app(tmp_path)
    output = await _call(app, "show_token")
    assert "done" in output
    assert TOKEN not in output
    assert "redacted" in output
    await app.aclose()


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE-KEY\n")
    return SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", denied_paths=[secret]
    )


async def _file_tool(settings: SandboxSettings, name: str, **arguments: object) -> str:
    executor = ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c1", name=name, arguments=json.dumps(arguments))
    return (await executor.execute(call)).content


async def test_read_file_refuses_a_hard_link_to_a_denied_file(
    settings: SandboxSettings, tmp_path: Path
) -> None:
    workspace = settings.resolved_workspace()
    workspace.mkdir()
    os.link(tmp_path / "secret" / "id_rsa", workspace / "innocent.txt")
    output = await _file_tool(settings, "read_file", path="innocent.txt")
    assert "PRIVATE-KEY" not in output
    assert "hard links" in output


async def test_write_file_refuses_a_hard_link_and_leaves_the_target_alone(
    settings: SandboxSettings, tmp_path: Path
) -> None:
    workspace = settings.resolved_workspace()
    workspace.mkdir()
    os.link(tmp_path / "secret" / "id_rsa", workspace / "innocent.txt")
    output = await _file_tool(settings, "write_file", path="innocent.txt", content="gone")
    assert "hard links" in output
    assert (tmp_path / "secret" / "id_rsa").read_text() == "PRIVATE-KEY\n"


async def test_path_rules_are_computed_once_per_configuration(settings: SandboxSettings) -> None:
    from core.sandbox.paths import PathRules

    first = PathRules.of(settings)
    await _file_tool(settings, "list_directory", path=".")
    assert PathRules.of(settings) is first


REWRITES = [
    "$(echo rm) -rf x",
    "`echo rm` -rf x",
    "R=rm; $R -rf x",
    "$'\\x72\\x6d' -rf x",
    "{rm,-rf,x}",
    "printf 'rm -rf x' | sh",
    "echo cm0gLXJmIHgK | base64 -d | bash",
    "python3 -c \"import shutil; shutil.rmtree('x')\"",
    "alias d='rm -rf'; d x",
    "eval rm -rf x",
    "bash <<< 'rm -rf x'",
    "perl -e 'system(\"rm -rf x\")'",
    "node -e \"require('fs').rmSync('x',{recursive:true})\"",
    "S=sudo; $S -n true",
    "{sudo,-n,true}",
]


@pytest.mark.parametrize("command", REWRITES)
async def test_every_rewrite_asks_an_approver_or_is_denied_without_one(
    settings: SandboxSettings, command: str
) -> None:
    workspace = settings.resolved_workspace()
    (workspace / "x").mkdir(parents=True)
    call = ToolCall(id="c1", name="bash", arguments=json.dumps({"command": command}))
    nobody = ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))
    result = await nobody.execute(call)
    assert result.is_error
    assert (workspace / "x").exists()
    asked: list[str] = []

    async def approver(tool: str, summary: str, reason: str) -> bool:
        asked.append(summary)
        return False

    denied = await ToolExecutor(
        ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings)
    ).execute(call, RunContext(approver=approver))
    assert denied.is_error
    assert (workspace / "x").exists()
    # A dynamic rm asks a human; a statically known sudo is refused without asking.
    assert asked or "blocked" in denied.content
