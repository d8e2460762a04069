"""An instruction file over `[instructions] max_bytes` is cut where a line ends, the model
is told so by a marker line, and the operator by a warning in every mode that starts
(`parley chat -m`, `parley chat`, `parley run`); interactive `parley chat` names what it
read as `parley run` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.instructions import GuidancePlaces, load_guidance
from core.instructions.files import cut_at_line
from tests.fakes.llm import FakeLLM, Reply
from tests.process import child_env, parley, write_config

RULE = "Rule {n:02}: never restart prod alone.\n"  # 37 bytes
RULES = "".join(RULE.format(n=n) for n in range(1, 31))  # 1,110 bytes
LIMIT = 256
KEPT = RULES[: RULES.rindex("\n", 0, LIMIT) + 1]  # the lines that fit whole
MARKER = f"[… AGENTS.md cut at {len(KEPT)} of {len(RULES):,} bytes: the limit is "


def test_a_long_agents_md_is_cut_at_a_line_with_a_marker_and_a_warning(tmp_path: Path) -> None:
    agents_md = tmp_path / "AGENTS.md"
    agents_md.write_text(RULES)
    guidance = load_guidance(GuidancePlaces(workspace_file=agents_md, max_bytes=LIMIT))
    assert guidance.workspace is not None
    text = guidance.workspace.text
    assert text == f"{KEPT.strip()}\n\n{MARKER}`instructions.max_bytes`]"
    [warning] = guidance.warnings
    assert str(agents_md) in warning
    assert f"{len(RULES):,} bytes, over `instructions.max_bytes` ({LIMIT})" in warning


def test_a_file_within_the_limit_is_whole_and_unmarked(tmp_path: Path) -> None:
    agents_md = tmp_path / "AGENTS.md"
    agents_md.write_text(RULES[:LIMIT])
    guidance = load_guidance(GuidancePlaces(workspace_file=agents_md, max_bytes=LIMIT))
    assert guidance.workspace is not None
    assert guidance.workspace.text == RULES[:LIMIT].strip()
    assert guidance.warnings == ()


@pytest.mark.parametrize(
    ("data", "limit", "kept"),
    [
        (b"one two three\nfour five six", 15, b"one two three\n"),  # a line's end first
        (b"one two three four five six", 15, b"one two three "),  # one long line: a word's
        ("ééééé".encode(), 5, "éé".encode()),  # no space either: whole characters
        ("€€€€".encode(), 7, "€€".encode()),
        ("🙂🙂🙂".encode(), 7, "🙂".encode()),
    ],
)
def test_a_cut_never_splits_a_line_a_word_or_a_character_it_can_avoid(
    data: bytes, limit: int, kept: bytes
) -> None:
    assert cut_at_line(data, limit) == kept


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """config.toml with a long AGENTS.md beside it and a low limit."""
    (tmp_path / "AGENTS.md").write_text(RULES)
    return write_config(tmp_path, f"[instructions]\nmax_bytes = {LIMIT}\n")


async def test_chat_m_warns_on_stderr_and_the_model_sees_the_marker(
    fake_llm: FakeLLM, config: Path
) -> None:
    fake_llm.script(Reply(text="Understood."))
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 0, err
    assert out == "Understood.\n"  # the warning is not part of the answer
    assert "parley: warning: instructions " in err
    assert f"AGENTS.md is {len(RULES):,} bytes, over `instructions.max_bytes`" in err
    system = fake_llm.requests[0].json["messages"][0]["content"]
    assert f"{KEPT.strip()}\n\n{MARKER}" in system
    assert RULES[len(KEPT) : len(KEPT) + 10] not in system  # nothing of the cut line


def _guidance_lines(err: str) -> list[str]:
    return [
        line
        for line in err.splitlines()
        if line.startswith(("parley: instructions:", "parley: warning: instructions"))
    ]


async def test_interactive_chat_prints_what_it_read_as_run_does(
    fake_llm: FakeLLM, config: Path
) -> None:
    fake_llm.script(Reply(text="hello"), Reply(text="hello"))
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, chat_err = await parley(
        "--config", str(config), "chat", env=env, stdin=b"hi\n/exit\n"
    )
    assert code == 0, chat_err
    code, _out, run_err = await parley("--config", str(config), "run", env=env, stdin=b"/exit\n")
    assert code == 0, run_err
    lines = _guidance_lines(chat_err)
    assert lines == _guidance_lines(run_err)
    assert lines[0] == "parley: instructions: AGENTS.md; skills: none"
    assert f"AGENTS.md is {len(RULES):,} bytes, over" in lines[1]
