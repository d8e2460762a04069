"""The `[skills]` and `[instructions]` sections of config.toml."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from core.instructions.files import DEFAULT_MAX_BYTES
from core.sections import SECTION_CONFIG


class SkillsConfig(BaseModel):
    """Agent Skills: folders with a SKILL.md (see `core.instructions.skills`)."""

    model_config = SECTION_CONFIG

    paths: list[Path] = Field(
        default_factory=lambda: [Path("skills")],
        description="Folders holding one skill folder each (relative: to config.toml's folder); "
        "[] offers no skills.",
    )


class InstructionsConfig(BaseModel):
    """Instruction files that join the system message (see `core.instructions.guidance`)."""

    model_config = SECTION_CONFIG

    file: Path | None = Field(
        Path("AGENTS.md"),
        description="The team's instructions for every conversation (relative: to "
        "config.toml's folder); empty for none.",
    )
    library: Path | None = Field(
        Path("instructions"),
        description="Folder of `NAME.md` files an approver may choose per chat with "
        "`/instructions set NAME` (relative: to config.toml's folder); empty for none.",
    )
    max_bytes: int = Field(
        DEFAULT_MAX_BYTES,
        ge=256,
        le=1 << 20,
        description="Per file; a longer one is cut at a line, with a marker the model sees "
        "and a warning.",
    )


def under_root(root: Path, path: Path | None) -> Path | None:
    """`path` (`~` expanded) as an absolute path, relative ones hanging off `root`; None
    when unset or empty."""
    if path is None or str(path) in ("", "."):
        return None
    expanded = Path(path).expanduser()
    return expanded if expanded.is_absolute() else root / expanded


__all__ = ["InstructionsConfig", "SkillsConfig", "under_root"]
