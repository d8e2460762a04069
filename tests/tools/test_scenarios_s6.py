"""The tool scenarios S6.1–S6.13 (docs/tools.md), each driven through `ToolExecutor.execute` so the
assertions are on the tool-result message the LLM would receive."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from core.messages import Message, ToolCall
from core.run_context import DETACHED, RunContext
from core.sandbox.gitenv import GIT_ENV
from core.sandbox.settings import SandboxSettings
from core.tools.base import Tool, ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.cli import load_cli_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from tests.helpers import pids_running, wait_dead


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(
        workspace=tmp_path / "ws",
        artifacts_dir=tmp_path / "artifacts",
        allowed_paths=[tmp_path / "shared"],
        denied_paths=[tmp_path / "shared" / "secrets"],
        output_cap_bytes=1024,
        default_timeout=5,
        max_timeout=10,
    )


def executor_for(settings: SandboxSettings, tools: list[Tool] | None = None) -> ToolExecutor:
    registry = ToolRegistry(builtin_tools() if tools is None else tools)
    return ToolExecutor(registry, ToolPolicy(), ToolContext(sandbox=settings))


async def call(
    executor: ToolExecutor, name: str, run: RunContext = DETACHED, **arguments: object
) -> Message:
    return await executor.execute(
        ToolCall(id="c1", name=name, arguments=json.dumps(arguments)), run
    )


async def test_s6_1_valid_params_execute(settings: SandboxSettings) -> None:
    result = await call(executor_for(settings), "bash", command="echo hello; echo oops >&2")
    assert not result.is_error
    assert result.role == "tool"
    assert result.tool_call_id == "c1"
    assert result.name == "bash"
    assert "exit_code: 0" in result.content
    assert re.search(r"duration: \d+\.\d\ds", result.content)
    assert "stdout:\nhello" in result.content
    assert "stderr:\noops" in result.content


async def test_s6_2_invalid_params_return_validation_error(settings: SandboxSettings) -> None:
    executor = executor_for(settings)
    missing = await call(executor, "bash", cmd="echo hi")
    wrong_type = await call(executor, "read_file", path="x.txt", offset="first")
    assert missing.is_error
    assert wrong_type.is_error
    assert "invalid arguments for `bash`" in missing.content
    assert "command: Field required" in missing.content
    assert "cmd: Extra inputs are not permitted" in missing.content
    assert "offset:" in wrong_type.content


async def test_s6_3_output_over_cap_is_cut_and_kept_as_artifact(
    settings: SandboxSettings,
) -> None:
    executor = executor_for(settings)
    result = await call(executor, "bash", command="seq 1 5000")
    expected = "".join(f"{n}\n" for n in range(1, 5001))
    assert not result.is_error
    assert result.content.count("bytes cut; full output in") == 1
    assert "stdout:\n1\n2\n3\n" in result.content
    assert "4999\n5000" in result.content
    assert len(result.content) < 2 * settings.output_cap_bytes
    match = re.search(r"full output in (\S+\.stdout\.txt)", result.content)
    assert match is not None
    assert "note: output was cut" in result.content

    # The model pages through the artifact with read_file until no next offset is offered.
    pages, offset = [], 1
    while True:
        page = await call(executor, "read_file", path=match.group(1), offset=offset)
        assert not page.is_error, page.content
        body, footer = page.content.rsplit("\n[lines ", 1)
        pages.append(body + "\n")
        next_offset = re.search(r"next: offset=(\d+)", footer)
        if next_offset is None:
            break
        offset = int(next_offset.group(1))
    assert len(pages) > 1
    assert "".join(pages) == expected


async def test_s6_4_timeout_kills_process_group(settings: SandboxSettings) -> None:
    command = "sleep 30.1 & sleep 30.2"  # found by their command lines: `$!` is the namespace's
    task = asyncio.create_task(call(executor_for(settings), "bash", command=command, timeout=0.5))
    async with asyncio.timeout(5):
        while len(pids := pids_running("sleep", "30.1") + pids_running("sleep", "30.2")) < 2:
            await asyncio.sleep(0.02)
    result = await task
    assert result.is_error
    assert "timed out; the process group was killed after 0.5s" in result.content
    assert wait_dead(pids) == []


async def test_s6_5_rm_rf_root_is_blocked(settings: SandboxSettings) -> None:
    asked: list[str] = []

    async def approve_everything(tool: str, summary: str, reason: str) -> bool:
        asked.append(summary)
        return True

    registry = ToolRegistry(builtin_tools())
    executor = ToolExecutor(registry, ToolPolicy(), ToolContext(sandbox=settings))
    run = RunContext(approver=approve_everything)
    result = await call(executor, "bash", run, command="rm -rf /")
    assert result.is_error
    assert "command blocked and not run" in result.content
    assert "root or home" in result.content
    assert asked == []  # refused outright: an approver cannot wave it through


async def test_s6_6_env_has_only_allowlisted_vars(
    settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-must-not-leak")
    monkeypatch.setenv("PATH", os.environ["PATH"])
    # git's numbered overrides are left out so the listing fits the test's output cap.
    command = "env | grep -v '^GIT_CONFIG_KEY_\\|^GIT_CONFIG_VALUE_'"
    result = await call(executor_for(settings), "bash", command=command)
    assert not result.is_error
    assert "OPENAI_API_KEY" not in result.content
    assert "sk-test" not in result.content
    assert "SLACK_BOT_TOKEN" not in result.content
    assert "xoxb-" not in result.content
    names = {line.split("=", 1)[0] for line in result.content.splitlines() if "=" in line}
    # bash itself adds PWD, SHLVL and `_`; Parley adds git's overrides (core/sandbox/gitenv.py).
    allowed = set(settings.env_allowlist) | {"PWD", "SHLVL", "_", "OLDPWD"} | set(GIT_ENV)
    assert names <= allowed
    assert "PATH" in names


TOOLS_YAML = """
tools:
  - name: greet
    description: "Greet someone"
    category: read
    cmd: echo
    args: ["hello", "{{who}}"]
    optional_args:
      shout: ["!!!"]
    parameters:
      who: {type: string, maxLength: 40, description: "Who to greet"}
      shout: {type: boolean, optional: true}
  - name: say
    description: "Print text verbatim"
    category: read
    cmd: printf
    args: ["%s\\n", "{{text}}"]
    parameters:
      text: {type: string}
  - name: kubectl_get
    description: "Get Kubernetes resources"
    category: read
    cmd: echo
    args: ["get", "{{resource}}"]
    optional_args:
      namespace: ["-n", "{{namespace}}"]
    parameters:
      resource: {type: string, enum: [pods, services]}
      namespace: {type: string, pattern: "^[a-z0-9-]+$", optional: true}
  - name: show_env
    description: "Print one variable"
    category: read
    cmd: printenv
    args: ["{{var}}"]
    env:
      DEPLOY_TOKEN: "${HOST_DEPLOY_TOKEN}"
    parameters:
      var: {type: string, enum: [DEPLOY_TOKEN, OPENAI_API_KEY]}
"""


def cli_executor(tmp_path: Path, settings: SandboxSettings) -> ToolExecutor:
    path = tmp_path / "tools.yaml"
    path.write_text(TOOLS_YAML, encoding="utf-8")
    tools = load_cli_tools(path, environ={"HOST_DEPLOY_TOKEN": "tok-123"})
    return executor_for(settings, builtin_tools() + tools)


async def test_s6_7_cli_tool_from_yaml_is_registered_and_callable(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    executor = cli_executor(tmp_path, settings)
    assert {"greet", "say", "kubectl_get", "show_env"} <= set(executor.registry.names())
    spec = next(s for s in executor.registry.specs() if s.name == "greet")
    assert spec.parameters["properties"]["who"]["description"] == "Who to greet"
    plain = await call(executor, "greet", who="world")
    loud = await call(executor, "greet", who="world", shout=True)
    assert not plain.is_error
    assert "exit_code: 0" in plain.content
    assert "stdout:\nhello world\n" in plain.content
    assert "stdout:\nhello world !!!\n" in loud.content


@pytest.mark.parametrize("text", ["$(touch pwned)", "; touch pwned", "`touch pwned` | x && y"])
async def test_s6_8_shell_metacharacters_stay_literal(
    tmp_path: Path, settings: SandboxSettings, text: str
) -> None:
    executor = cli_executor(tmp_path, settings)
    result = await call(executor, "say", text=text)
    assert not result.is_error
    assert f"stdout:\n{text}\n" in result.content
    assert list(tmp_path.rglob("pwned")) == []


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ({"resource": "pods; rm -rf ~"}, "resource: Input should be 'pods' or 'services'"),
        ({"resource": "pods", "namespace": "default; rm -rf ~"}, "namespace: String should"),
        ({"resource": "pods", "namespace": "$(rm -rf ~)"}, "namespace: String should"),
    ],
)
async def test_s6_9_template_injection_rejected_by_enum_or_pattern(
    tmp_path: Path, settings: SandboxSettings, arguments: dict[str, str], complaint: str
) -> None:
    executor = cli_executor(tmp_path, settings)
    result = await call(executor, "kubectl_get", **arguments)
    assert result.is_error
    assert "invalid arguments for `kubectl_get`" in result.content
    assert complaint in result.content


async def test_s6_10_read_file_outside_allowed_paths_is_denied(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("top secret")
    executor = executor_for(settings)
    for path in (str(outside), "../outside.txt"):
        result = await call(executor, "read_file", path=path)
        assert result.is_error
        assert "permission denied" in result.content
        assert "outside the allowed roots" in result.content
        assert "top secret" not in result.content


async def test_s6_11_write_file_to_denied_path_inside_allowed_root_is_denied(
    settings: SandboxSettings,
) -> None:
    target = settings.allowed_paths[0] / "secrets" / "key.txt"
    result = await call(executor_for(settings), "write_file", path=str(target), content="x")
    assert result.is_error
    assert "permission denied" in result.content
    assert "denied path" in result.content
    assert not target.exists()


async def test_s6_12_symlink_pointing_outside_is_rejected(
    tmp_path: Path, settings: SandboxSettings
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.txt").write_text("private")
    workspace = settings.resolved_workspace()
    workspace.mkdir(parents=True)
    (workspace / "escape").symlink_to(outside)
    (workspace / "file_link").symlink_to(outside / "data.txt")
    executor = executor_for(settings)
    results = [
        await call(executor, "read_file", path="escape/data.txt"),
        await call(executor, "read_file", path="file_link"),
        await call(executor, "list_directory", path="escape"),
        await call(executor, "write_file", path="escape/new.txt", content="x"),
        await call(executor, "write_file", path="file_link", content="overwritten"),
    ]
    for result in results:
        assert result.is_error
        assert "outside the allowed roots" in result.content
    assert (outside / "data.txt").read_text() == "private"
    assert not (outside / "new.txt").exists()


async def test_s6_13_tool_declared_env_var_is_passed(
    tmp_path: Path, settings: SandboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    executor = cli_executor(tmp_path, settings)
    declared = await call(executor, "show_env", var="DEPLOY_TOKEN")
    undeclared = await call(executor, "show_env", var="OPENAI_API_KEY")
    assert not declared.is_error
    assert "stdout:\ntok-123" in declared.content
    assert undeclared.is_error  # printenv exits 1 for an unset variable
    assert "sk-test" not in undeclared.content
