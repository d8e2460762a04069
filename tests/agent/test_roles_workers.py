"""Roles with several workers on one PostgreSQL store (docs/governance.md#roles): a message
taken in by one worker and run by another runs with its sender's role, not the default."""

from __future__ import annotations

from pathlib import Path

from tests.agent.test_workers import Platform, until, workers
from tests.agentkit import inbound
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.store.conftest import postgres_schema

SLACK = ("slack", "C1", "")
ROLES = {"default": "viewer", "viewer": {"categories": ["read"]}}  # everyone read-only …
CHANNELS = {"slack": {"approvers": ["U1"]}}  # … but U1, an admin


async def test_a_run_claimed_by_another_worker_has_its_senders_role(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "a.txt", "content": "admin"})]),
        Reply(text="Written."),
    )
    platform = Platform()
    async with (
        postgres_schema() as url,
        workers(
            fake_llm, tmp_path, url, platform, 2, ("slack",), roles=ROLES, channels=CHANNELS
        ) as agents,
    ):
        taker, runner = agents
        assert taker.workers is not None
        assert runner.workers is not None
        taker.workers.stop_claiming()  # the other worker must run it
        await taker.submit(
            inbound("write it", key=SLACK, user_id="U1", event_id="e1"), platform(SLACK)
        )
        await until(lambda: platform.answered() >= 1)
        [run] = await runner.store.runs(limit=5)
        assert run.worker == runner.workers.id
    assert platform(SLACK).finals == ["Written."]
    assert (tmp_path / "workspace" / "a.txt").read_text() == "admin"
