"""Agent Skills: folders holding a `SKILL.md` (YAML front matter with `name` and
`description`, then Markdown instructions) and any scripts or files it refers to.

Parley reads every skill folder directly under each configured path. Only the names and
descriptions go into the system message; `load_skill` returns a skill's body and lists
its files, and the model runs its scripts with `bash`, under the same walls as any other
command. A SKILL.md that cannot be read as a skill is skipped with a warning naming the
file; the other skills are not affected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from core.instructions.files import UnreadableFile, read_text
from core.records import record

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_SKILL_BYTES = 256 * 1024
MAX_SKILLS = 200
# Lower-case letters, digits and single hyphens inside, as the Agent Skills format says.
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_FENCE = re.compile(r"^---[ \t]*$", re.MULTILINE)


class SkillError(ValueError):
    """Why a SKILL.md is not a usable skill (for the warning)."""


@record(frozen=True, slots=True)
class Skill:
    """One skill as read at the last (re)load.

    Attributes:
        name: its `name` (also its folder's name).
        description: its `description`: what it does and when to use it.
        directory: its folder, symlinks resolved.
        body: the Markdown after the front matter.
    """

    name: str
    description: str
    directory: Path
    body: str


@record(frozen=True, slots=True)
class SkillScan:
    """The skills found under the configured paths, and a warning per file skipped."""

    skills: tuple[Skill, ...] = ()
    warnings: tuple[str, ...] = ()


def parse_skill(text: str, folder: str) -> tuple[str, str, str]:
    """(name, description, body) of a SKILL.md's `text` in the folder named `folder`.

    Raises:
        SkillError: no front matter, bad YAML, or a missing or invalid name or description.
    """
    if not text.startswith("---"):
        raise SkillError("it does not start with YAML front matter (a `---` line)")
    first = _FENCE.match(text)
    close = _FENCE.search(text, first.end()) if first is not None else None
    if first is None or close is None:
        raise SkillError("its front matter is not closed by a `---` line")
    try:
        meta = yaml.safe_load(text[first.end() : close.start()])
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise SkillError(f"its front matter is not valid YAML{line}") from exc
    if not isinstance(meta, dict):
        raise SkillError("its front matter is not a mapping of keys to values")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise SkillError(
            f"`name` must be lower-case letters, digits and single hyphens, at most "
            f"{MAX_NAME} characters (got {name!r})"
        )
    if name != folder:
        raise SkillError(f"`name` {name!r} is not its folder's name {folder!r}")
    if not isinstance(description, str) or not description.strip():
        raise SkillError("`description` is missing or empty")
    if len(description) > MAX_DESCRIPTION:
        raise SkillError(f"`description` is longer than {MAX_DESCRIPTION} characters")
    body = text[close.end() :].strip("\n")
    return name, " ".join(description.split()), body


def _skill_folders(root: Path, warnings: list[str]) -> list[Path]:
    """The skill folders of one configured path: the path itself if it holds a
    SKILL.md, else its subfolders that do. Symlinked folders are skipped: where they lead
    need not be protected from tools."""
    if (root / SKILL_FILE).exists() or (root / SKILL_FILE).is_symlink():
        return [root]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        warnings.append(f"skills path {root}: {exc.strerror}; no skills read from it")
        return []
    folders = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            if os.path.lexists(os.path.join(entry.path, SKILL_FILE)):
                warnings.append(f"skill {entry.path} is a symlink: skipped")
            continue
        if entry.is_dir(follow_symlinks=False) and os.path.lexists(
            os.path.join(entry.path, SKILL_FILE)
        ):
            folders.append(Path(entry.path))
    return folders


def find_skills(roots: Sequence[Path]) -> SkillScan:
    """Every skill under `roots`, in order; the first of two with one name wins."""
    warnings: list[str] = []
    skills: dict[str, Skill] = {}
    for root in roots:
        for folder in _skill_folders(root, warnings):
            path = folder / SKILL_FILE
            try:
                text, cut = read_text(path, MAX_SKILL_BYTES)
                if cut:
                    raise SkillError(f"it is longer than {MAX_SKILL_BYTES} bytes")
                name, description, body = parse_skill(text, folder.name)
            except (SkillError, UnreadableFile, OSError) as exc:
                warnings.append(f"skill {path} skipped: {exc}")
                continue
            if name in skills:
                warnings.append(
                    f"skill {path} skipped: the name `{name}` is taken by "
                    f"{skills[name].directory / SKILL_FILE}"
                )
                continue
            if len(skills) >= MAX_SKILLS:
                warnings.append(f"skill {path} skipped: more than {MAX_SKILLS} skills")
                continue
            skills[name] = Skill(name, description, folder.resolve(), body)
    return SkillScan(tuple(skills.values()), tuple(warnings))


__all__ = [
    "MAX_DESCRIPTION",
    "MAX_NAME",
    "SKILL_FILE",
    "Skill",
    "SkillError",
    "SkillScan",
    "find_skills",
    "parse_skill",
]
