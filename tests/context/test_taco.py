"""TACO: big tool outputs are compressed and/or offloaded before they enter the history."""

from __future__ import annotations

from pathlib import Path

from core.context.manager import TACO_HEADER, ContextManager, ContextSettings
from core.messages import Message, ToolCall
from tests.context import WordCounter, words

CALL = ToolCall(id="c1", name="bash")


class Summary:
    def __init__(self, text: str = "exit 0; 3 files changed", fail: bool = False) -> None:
        self.text, self.fail, self.calls = text, fail, 0

    async def __call__(self, prompt: str) -> str:
        self.calls += 1
        if self.fail:
            raise RuntimeError("down")
        return self.text


def manager(summary: Summary | None, artifacts: Path | None) -> ContextManager:
    config = ContextSettings(taco_threshold=100, taco_target=20)
    return ContextManager(100_000, WordCounter(), summary, config, artifacts_dir=artifacts)


def big() -> Message:
    return Message.tool_result(CALL, words(500, "line"))


async def test_small_outputs_pass_untouched(tmp_path: Path) -> None:
    summary = Summary()
    small = Message.tool_result(CALL, words(50))
    assert await manager(summary, tmp_path).process_tool_result(small, approved=False) is small
    assert summary.calls == 0


async def test_offload_writes_the_artifact_and_notes_its_path(tmp_path: Path) -> None:
    cm, raw = manager(None, tmp_path / "artifacts"), big()
    out = await cm.process_tool_result(raw, approved=False)
    [artifact] = (tmp_path / "artifacts").iterdir()
    assert artifact.read_text() == raw.content
    assert f"[full output: {artifact}; read it with read_file]" in out.content
    assert (out.tool_call_id, out.name, out.is_error) == ("c1", "bash", False)
    assert cm.counter.message(out) < 100  # cut, and the cached count is the new one


async def test_compressed_with_the_summarizer(tmp_path: Path) -> None:
    summary = Summary()
    out = await manager(summary, tmp_path).process_tool_result(big(), approved=False)
    assert out.content.startswith(f"{TACO_HEADER}\nexit 0; 3 files changed")
    assert "[full output:" in out.content
    assert summary.calls == 1


async def test_approved_results_are_never_summarised(tmp_path: Path) -> None:
    summary, raw = Summary(), big()
    assert await manager(summary, tmp_path).process_tool_result(raw, approved=True) is raw
    assert summary.calls == 0
    assert list(tmp_path.iterdir()) == []


async def test_failure_keeps_the_raw_output() -> None:
    raw = big()
    assert await manager(Summary(fail=True), None).process_tool_result(raw, approved=False) is raw


async def test_unwritable_artifacts_dir_keeps_the_raw_output(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    raw = big()
    out = await manager(Summary(), blocker / "sub").process_tool_result(raw, approved=False)
    assert out is raw


async def test_a_sandbox_capped_output_keeps_its_one_artifact(tmp_path: Path) -> None:
    from core.sandbox.outputcap import cap_output

    full = tmp_path / "sandbox artifacts" / "bash-1.txt"  # a path with a space
    capped, truncated, _ = cap_output(words(3000, "row").encode(), 4096, full)
    assert truncated
    cm = manager(None, tmp_path / "artifacts")
    result = Message.tool_result(CALL, capped, artifacts=(str(full),))  # as the executor does
    out = await cm.process_tool_result(result, approved=False)
    assert not (tmp_path / "artifacts").exists()  # no second file of the capped text
    assert f"[full output: {full}; read it with read_file]" in out.content
