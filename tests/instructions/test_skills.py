"""Agent Skills as files on disk: a SKILL.md that cannot be read as a skill is skipped with
a warning naming it and nothing else is affected; `load_skill` returns a skill's body and
its files, or one file, and nothing outside the skill's folder."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from core.instructions import find_skills
from core.instructions.guidance import Guidance
from core.instructions.tool import LoadSkillTool
from core.messages import ToolCall
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

GOOD = """\
---
name: {name}
description: Deploy a service to staging. Use when asked to deploy or roll back.
license: MIT
---
# Deploying

Run `scripts/deploy.sh <service>` from the skill's folder.
"""


def skill(root: Path, folder: str, text: str) -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


BROKEN = {
    "no-front-matter": "# Just Markdown\n",
    "unclosed": "---\nname: unclosed\ndescription: x\n# body\n",
    "bad-yaml": "---\nname: bad-yaml\ndescription: [unclosed\n---\nbody\n",
    "not-a-mapping": "---\n- a\n- b\n---\nbody\n",
    "no-description": "---\nname: no-description\n---\nbody\n",
    "wrong-name": "---\nname: another-name\ndescription: x\n---\nbody\n",
    "Upper-Case": "---\nname: Upper-Case\ndescription: x\n---\nbody\n",
    "tab-indent": "---\nname: tab-indent\ndescription: x\n\tbad: tab\n---\nbody\n",
}


@pytest.mark.parametrize("folder", sorted(BROKEN))
def test_a_broken_skill_is_skipped_with_a_warning_naming_it_and_the_others_stay(
    tmp_path: Path, folder: str
) -> None:
    root = tmp_path / "skills"
    skill(root, "deploy", GOOD.format(name="deploy"))
    broken = skill(root, folder, BROKEN[folder])
    skill(root, "zz-last", GOOD.format(name="zz-last"))
    scan = find_skills([root])
    assert [s.name for s in scan.skills] == ["deploy", "zz-last"]
    assert len(scan.warnings) == 1
    assert str(broken) in scan.warnings[0]
    assert "skipped" in scan.warnings[0]


def test_a_skill_is_read_with_its_description_and_body(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    skill(root, "deploy", GOOD.format(name="deploy"))
    (root / "notes").mkdir()  # a folder without SKILL.md is not a skill, and no warning
    [found] = find_skills([root, tmp_path / "missing"]).skills
    assert found.description.startswith("Deploy a service to staging.")
    assert found.body.startswith("# Deploying")
    assert found.directory == (root / "deploy").resolve()
    assert find_skills([root]).warnings == ()


def test_symlinked_and_hard_linked_skills_are_refused(tmp_path: Path) -> None:
    """Where a link leads need not be protected from tools: a tool could write the skill."""
    root, elsewhere = tmp_path / "skills", tmp_path / "workspace"
    skill(elsewhere, "linked", GOOD.format(name="linked"))
    root.mkdir()
    (root / "linked").symlink_to(elsewhere / "linked")
    hard = skill(elsewhere, "hard", GOOD.format(name="hard"))
    (root / "hard").mkdir()
    os.link(hard, root / "hard" / "SKILL.md")
    scan = find_skills([root])
    assert scan.skills == ()
    assert any("linked is a symlink" in w for w in scan.warnings)
    assert any("hard links" in w for w in scan.warnings)


def test_the_first_of_two_skills_with_one_name_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    skill(first, "deploy", GOOD.format(name="deploy"))
    skill(second, "deploy", GOOD.format(name="deploy").replace("staging", "production"))
    scan = find_skills([first, second])
    assert [s.directory for s in scan.skills] == [(first / "deploy").resolve()]
    assert "is taken by" in scan.warnings[0]


@pytest.fixture
def executor(tmp_path: Path) -> ToolExecutor:
    root = tmp_path / "skills"
    skill(root, "deploy", GOOD.format(name="deploy"))
    (root / "deploy" / "scripts").mkdir()
    (root / "deploy" / "scripts" / "deploy.sh").write_text("echo deploying $1\n")
    (root / "deploy" / "reference.md").write_text("Staging is at staging.internal.\n")
    (tmp_path / "secret.txt").write_text("TOP SECRET\n")
    (root / "deploy" / "leak.md").symlink_to(tmp_path / "secret.txt")
    guidance = Guidance(skills=find_skills([root]).skills)
    sandbox = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    return ToolExecutor(ToolRegistry([LoadSkillTool(guidance)]), ToolPolicy(), ToolContext(sandbox))


async def load(executor: ToolExecutor, **arguments: str) -> tuple[str, bool]:
    import json

    call = ToolCall(id="c1", name="load_skill", arguments=json.dumps(arguments))
    message = await executor.execute(call)
    return message.content, message.is_error


async def test_load_skill_returns_the_body_and_lists_the_files(executor: ToolExecutor) -> None:
    text, error = await load(executor, name="deploy")
    assert not error
    assert "Run `scripts/deploy.sh <service>`" in text
    assert "- scripts/deploy.sh (" in text
    assert "- reference.md (" in text
    assert "leak.md (symlink, not followed)" in text
    assert "SKILL.md (" not in text  # the body is already there


async def test_load_skill_reads_one_file_of_the_folder(executor: ToolExecutor) -> None:
    text, error = await load(executor, name="deploy", file="reference.md")
    assert (text, error) == ("Staging is at staging.internal.\n", False)


@pytest.mark.parametrize(
    ("name", "file", "why"),
    [
        ("deploy", "../../secret.txt", "not a file in the folder"),
        ("deploy", "/etc/hostname", "not a file in the folder"),
        ("deploy", "leak.md", "symlink"),
        ("deploy", "scripts", "not a regular file"),
        ("deploy", "missing.md", "has no file"),
        ("other", None, "there is no skill `other` (skills: deploy)"),
    ],
)
async def test_load_skill_reads_nothing_outside_the_skill(
    executor: ToolExecutor, name: str, file: str | None, why: str
) -> None:
    arguments = {"name": name} if file is None else {"name": name, "file": file}
    text, error = await load(executor, **arguments)
    assert error
    assert why in text
    assert "TOP SECRET" not in text


def test_load_skill_is_a_read_tool() -> None:
    """It runs without asking, in chat and cron jobs alike: it only reads."""
    assert LoadSkillTool(Guidance()).category == "read"
