"""The README's worked example: `examples/mcp_notes/server.py` as configured there, its
resources offered because `resources` names a category (and not otherwise)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from core.messages import ToolCall
from core.tools.executor import ToolExecutor
from tests.agentkit import running_agent
from tests.fakes.llm import FakeLLM
from tests.mcp.conftest import PYTHON_PATHS
from tests.process import REPO

pytestmark = pytest.mark.usefixtures("landlock_required")

EXAMPLE = REPO / "examples" / "mcp_notes" / "server.py"


def notes(**settings: Any) -> dict[str, Any]:
    return {
        "servers": {
            "notes": {
                "command": [sys.executable, str(EXAMPLE)],
                "env": ["NOTES_AUTHOR"],
                "default": "admin",
                "tools": {"list_notes": "read", "read_note": "read", "add_note": "write"},
                "read_paths": PYTHON_PATHS,
                **settings,
            }
        }
    }


async def call(executor: ToolExecutor, name: str, **args: Any) -> str:
    message = await executor.execute(ToolCall(id=name, name=name, arguments=json.dumps(args)))
    return message.content


async def test_the_worked_example(fake_llm: FakeLLM, tmp_path: Path) -> None:
    environ = {"NOTES_AUTHOR": "ops-bot"}
    async with running_agent(
        fake_llm, tmp_path, mcp=notes(resources="read"), environ=environ
    ) as agent:
        app: Any = agent.factory
        executor: ToolExecutor = app.conversation("fake").executor
        names = app.registry.names()
        assert await call(executor, "mcp__notes__add_note", title="deploys", text="v2 out") == (
            "Added to 'deploys'."
        )
        assert await call(executor, "mcp__notes__read_note", title="deploys") == (
            "v2 out\n— ops-bot\n\n"
        )
        assert await call(executor, "mcp__notes__list_notes") == "deploys"
        listed = await call(executor, "mcp__notes__resources_list")
        assert listed.startswith("- notes://index")
        assert await call(executor, "mcp__notes__resources_read", uri="notes://index") == "deploys"
    assert "mcp__notes__delete_note" in names  # admin: offered, asks before it runs
    assert (tmp_path / "mcp" / "notes" / "notes" / "deploys.md").exists()  # its own directory


async def test_resources_and_prompts_are_offered_only_where_configured(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with running_agent(
        fake_llm, tmp_path, mcp=notes(), environ={"NOTES_AUTHOR": "x"}
    ) as agent:
        names: list[str] = agent.factory.registry.names()  # type: ignore[attr-defined]
    mcp = sorted(n for n in names if n.startswith("mcp__"))
    assert mcp == [
        "mcp__notes__add_note",
        "mcp__notes__delete_note",
        "mcp__notes__list_notes",
        "mcp__notes__read_note",
    ]
