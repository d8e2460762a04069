"""Running a tool in the sandbox: the tool environment and the observation's artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.messages import ToolCall
from core.sandbox.gitenv import GIT_ENV
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashTool
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import tool_env


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
    assert set(env) <= set(settings.env_allowlist) | {"KUBECONFIG"} | set(GIT_ENV)


# --- the observation ---------------------------------------------------------------------


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
