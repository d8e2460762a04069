"""What Parley tells the model beyond its system prompt: the team's instruction files
(AGENTS.md, per channel, chosen per chat) and Agent Skills, re-read between turns when
they change. The `load_skill` tool is in `core.instructions.tool`."""

from core.instructions.guidance import Guidance, GuidancePlaces, load_guidance, signature
from core.instructions.settings import InstructionsConfig, SkillsConfig, under_root
from core.instructions.skills import Skill, find_skills, parse_skill

__all__ = [
    "Guidance",
    "GuidancePlaces",
    "InstructionsConfig",
    "Skill",
    "SkillsConfig",
    "find_skills",
    "load_guidance",
    "parse_skill",
    "signature",
    "under_root",
]
