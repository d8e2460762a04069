"""What the configuration tells the model besides the system prompt: the team's
instruction files and the skills index, read together into one immutable `Guidance`.

A conversation is built from the `Guidance` current at the start of its turn and keeps it
for the whole turn, so an edit takes effect between turns, never mid-turn. The text only
changes when the files change, so the system message stays byte-for-byte the same from
turn to turn (prompt caching), and a change shows in the run's prompt hash.

Where the files are (`GuidancePlaces`): `AGENTS.md`, the instruction library `instructions/`
and `skills/` beside config.toml by default (relative paths hang off its folder, as
`tools_file` does), channel instruction files wherever a channel's `instructions` names
them. They are protected configuration: tools can read the skills (to run their scripts)
but neither write nor create any of them. Not the workspace root: it is the working
directory of every tool under `workspace_scope = "shared"` and of runs outside a
conversation, and the kernel cannot keep one name in a writable directory from being
created or replaced without taking that right for the whole directory — every such run
would lose the right to create anything at the top of its workspace. A team that keeps
config.toml at the top of its workspace has them there (that top is frozen already).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path

from core.instructions.files import InstructionFile, read_instruction, read_library
from core.instructions.skills import SKILL_FILE, Skill, find_skills
from core.records import record

SKILLS_HEADING = (
    "Skills: instructions and scripts for particular tasks. Before doing a task one of "
    "them covers, call `load_skill` with its name and follow what it says."
)


@record(frozen=True, slots=True)
class GuidancePlaces:
    """Where the guidance files are, as absolute paths (None: not used).

    Attributes:
        workspace_file: the team's instructions for every conversation (AGENTS.md).
        library: folder of `NAME.md` files an approver may choose per chat.
        channels: per platform (`slack`, …), the instruction file of its conversations.
        skills: folders holding skill folders.
        max_bytes: per instruction file.
    """

    workspace_file: Path | None = None
    library: Path | None = None
    channels: Mapping[str, Path] = field(default_factory=dict)
    skills: tuple[Path, ...] = ()
    max_bytes: int = 32 * 1024

    def files(self) -> list[Path]:
        """Every file and folder that is protected configuration (frozen for tools)."""
        found = [p for p in (self.workspace_file, self.library) if p is not None]
        return [*found, *self.channels.values(), *self.skills]


@record(frozen=True, slots=True)
class Guidance:
    """The instruction files and skills as read at the last (re)load."""

    workspace: InstructionFile | None = None
    channels: Mapping[str, InstructionFile] = field(default_factory=dict)
    library: Mapping[str, InstructionFile] = field(default_factory=dict)
    skills: tuple[Skill, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """No instruction file and no skill was read."""
        return not (self.workspace or self.channels or self.library or self.skills)

    def skill(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name), None)

    def instructions(self, channel: str | None = None, chosen: str | None = None) -> str:
        """The instruction part of the system message for a conversation on `channel`
        (a platform name; None: a cron job or a run outside a chat) in a chat whose
        approvers chose the library file `chosen`."""
        parts = []
        if self.workspace is not None:
            parts.append(_section(f"Team instructions ({self.workspace.label})", self.workspace))
        own = self.channels.get(channel) if channel else None
        if own is not None:
            parts.append(_section(f"Instructions for {channel} ({own.label})", own))
        picked = self.library.get(chosen) if chosen else None
        if picked is not None:
            parts.append(_section(f"Instructions chosen for this chat ({picked.label})", picked))
        return "\n\n".join(parts)

    def skills_index(self) -> str:
        """The skills part of the system message: one line per skill."""
        if not self.skills:
            return ""
        lines = [f"- {s.name}: {s.description}" for s in self.skills]
        return "\n".join([SKILLS_HEADING, *lines])

    def describe(self) -> str:
        """One line for start-up and reloads: what was read."""
        read = [f.label for f in (self.workspace, *self.channels.values()) if f is not None]
        skills = ", ".join(s.name for s in self.skills) or "none"
        library = f"; instruction library: {', '.join(self.library)}" if self.library else ""
        return f"instructions: {', '.join(read) or 'none'}; skills: {skills}{library}"

    def start_up_lines(self) -> list[str]:
        """What every interactive start prints (`parley run`, `parley chat`): the line
        of what was read, then a line per file cut or not used."""
        return [self.describe(), *(f"warning: {w}" for w in self.warnings)]


def _section(title: str, file: InstructionFile) -> str:
    return f"{title}:\n\n{file.text}"


def load_guidance(places: GuidancePlaces) -> Guidance:
    """Read every guidance file of `places`; what cannot be used is left out with a
    warning naming it."""
    warnings: list[str] = []
    workspace = None
    if places.workspace_file is not None:
        workspace = read_instruction(
            places.workspace_file, places.workspace_file.name, places.max_bytes, warnings
        )
    channels = {}
    for name, path in places.channels.items():
        read = read_instruction(path, path.name, places.max_bytes, warnings)
        if read is not None:
            channels[name] = read
        elif not path.exists():
            warnings.append(f"instructions of channel {name}: {path} does not exist")
    library = {}
    if places.library is not None:
        library = read_library(places.library, places.max_bytes, warnings)
    scan = find_skills(places.skills)
    return Guidance(workspace, channels, library, scan.skills, (*warnings, *scan.warnings))


Stamp = tuple[str, int, int, int, int] | tuple[str]


def _stamp(path: str) -> Stamp:
    try:
        info = os.lstat(path)
    except OSError:
        return (path,)
    return (path, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def signature(files: list[Path], folders: list[Path]) -> tuple[Stamp, ...]:
    """What changes when any of `files` or the folders' entries (one level down, and each
    entry's SKILL.md) is written, created, removed or replaced: their inode, size and
    times. Taken before the files are read, so an edit made while they are read shows as
    a change at the next look."""
    stamps = [_stamp(str(p)) for p in files]
    for folder in folders:
        stamps.append(_stamp(str(folder)))
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            entry = os.path.join(folder, name)
            stamps += [_stamp(entry), _stamp(os.path.join(entry, SKILL_FILE))]
    return tuple(stamps)


__all__ = ["Guidance", "GuidancePlaces", "load_guidance", "signature"]
