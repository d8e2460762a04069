"""`parley chat -m` runs outside any conversation; each one keeps the artifacts (full
outputs of cut tool results) of its own, so one run's tools cannot read what another
run's tools printed. Tried as the finding was made: a later one-shot run goes after the
artifact an earlier one left."""

from __future__ import annotations

import re
from pathlib import Path

from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.process import child_env, parley, write_config

# More than `output_cap_bytes` (64 KiB): the middle is cut and kept in an artifact (and
# the result is long enough that the context manager has the model compress it).
LOUD = "seq 1 15000; echo {mark}; seq 1 15000"
COMPRESSED = Reply(text="the numbers 1 to 15000, a mark, then again")


def _artifact(fake_llm: FakeLLM, request: int) -> Path:
    """The artifact named by the last tool result in request `request`."""
    messages = fake_llm.requests[request].json["messages"]
    result = [m["content"] for m in messages if m["role"] == "tool"][-1]
    found = re.search(r"full output: (\S+?);", result)
    assert found, result
    return Path(found.group(1))


async def test_one_shot_runs_do_not_share_artifacts(fake_llm: FakeLLM, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": LOUD.format(mark="RUN-A-MIDDLE")})]),
        COMPRESSED,
        Reply(text="a done"),
    )
    code, _, err = await parley("--config", str(config), "chat", "-m", "count", env=env)
    assert code == 0, err
    first = _artifact(fake_llm, 2)
    assert "RUN-A-MIDDLE" in first.read_text()
    assert first.parent.parent == tmp_path / "artifacts"

    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("bash", {"command": f"cat {first}; ls {first.parent}"}),
                ToolCallSpec("read_file", {"path": str(first)}),
                ToolCallSpec("bash", {"command": LOUD.format(mark="RUN-B-MIDDLE")}),
            ]
        ),
        COMPRESSED,
        Reply(text="b done"),
    )
    code, _, err = await parley("--config", str(config), "chat", "-m", "snoop", env=env)
    assert code == 0, err
    results = [m for m in fake_llm.requests[5].json["messages"] if m["role"] == "tool"]
    snoop, read = results[-3]["content"], results[-2]["content"]
    assert "RUN-A-MIDDLE" not in snoop
    assert "Permission denied" in snoop, snoop
    assert "RUN-A-MIDDLE" not in read
    second = _artifact(fake_llm, 5)
    assert "RUN-B-MIDDLE" in second.read_text()
    assert second.parent != first.parent
    assert {first.parent.name[:4], second.parent.name[:4]} == {"run-"}
    fake_llm.assert_complete()
