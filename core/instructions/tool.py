"""`load_skill` (read): a skill's instructions and the files in its folder, or one of
those files. The skills are those of the conversation's configuration at the start of
its turn (`core.instructions.guidance`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from core.errors import ToolError
from core.instructions.files import UnreadableFile, read_text
from core.instructions.guidance import Guidance
from core.instructions.skills import SKILL_FILE, Skill
from core.tools.base import Category, Tool, ToolContext, ToolResult

MAX_LISTED = 200
MAX_DEPTH = 4


class _LoadSkill(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built if there are skills

    name: str = Field(min_length=1, max_length=64, description="The skill's name.")
    file: str | None = Field(
        None,
        max_length=500,
        description="A file in the skill's folder (as listed), to read it instead.",
    )


class LoadSkillTool(Tool):
    """Returns a skill's body and lists its files; never runs anything."""

    name = "load_skill"
    description = (
        "Read a skill (listed in the system message): its instructions and the files in "
        "its folder, or with `file`, one of those files. Run its scripts with bash."
    )
    category: Category = "read"
    params = _LoadSkill

    def __init__(self, guidance: Guidance) -> None:
        self.guidance = guidance

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, _LoadSkill)
        skill = self.guidance.skill(args.name)
        if skill is None:
            known = ", ".join(s.name for s in self.guidance.skills) or "none"
            raise ToolError(f"there is no skill `{args.name}` (skills: {known})")
        if args.file is not None:
            return ToolResult(_read_file(skill, args.file, ctx.sandbox.output_cap_bytes))
        files = _listing(skill.directory)
        listed = "\n".join(f"- {f}" for f in files) or "(no other files)"
        return ToolResult(
            f"Skill `{skill.name}` — folder {skill.directory} (run its scripts from there "
            f"with bash; read a file with load_skill and `file`).\n\n{skill.body}\n\n"
            f"Files in the folder:\n{listed}"
        )


def _listing(directory: Path) -> list[str]:
    """Files below `directory` (not SKILL.md), relative, with their sizes; symlinks are
    listed as such and not followed."""
    found: list[str] = []
    pending = [(directory, 0)]
    while pending and len(found) < MAX_LISTED:
        folder, depth = pending.pop(0)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            relative = os.path.relpath(entry.path, directory)
            if entry.is_symlink():
                found.append(f"{relative} (symlink, not followed)")
            elif entry.is_dir(follow_symlinks=False):
                if depth + 1 < MAX_DEPTH:
                    pending.append((Path(entry.path), depth + 1))
            elif relative != SKILL_FILE:
                found.append(f"{relative} ({entry.stat(follow_symlinks=False).st_size} bytes)")
            if len(found) >= MAX_LISTED:
                found.append(f"… (more than {MAX_LISTED} files)")
                break
    return found


def _read_file(skill: Skill, name: str, cap: int) -> str:
    """One file of the skill's folder: a regular file inside it, reached by no symlink."""
    lexical = os.path.normpath(os.path.join(skill.directory, name))
    if not (lexical + "/").startswith(str(skill.directory) + "/") or lexical == str(
        skill.directory
    ):
        raise ToolError(f"`{name}` is not a file in the folder of skill `{skill.name}`")
    if os.path.realpath(lexical) != lexical:
        raise ToolError(f"`{name}` is reached through a symlink: not read")
    try:
        if not stat.S_ISREG(os.lstat(lexical).st_mode):
            raise ToolError(f"`{name}` is not a regular file")
        text, cut = read_text(Path(lexical), cap)
    except FileNotFoundError:
        raise ToolError(f"skill `{skill.name}` has no file `{name}`") from None
    except UnreadableFile as exc:
        raise ToolError(str(exc)) from None
    if cut:
        text += f"\n\n[cut at {cap} bytes]"
    return text


__all__ = ["LoadSkillTool"]
