"""`/instructions`: what the model is told in this chat, and the approvers' choice of an
instruction file from the library for the chat (every conversation in it, like
`/provider`). The choice is kept in the store and applies from each conversation's next
turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.chat import Inbound

if TYPE_CHECKING:
    from core.agent.lane import Lane, LaneHost

USAGE = "Usage: /instructions [list | set NAME | clear]"


async def instructions_command(host: LaneHost, lane: Lane, inbound: Inbound, args: str) -> str:
    """The reply to `/instructions args` from `inbound`'s sender in `lane`'s chat."""
    guidance = host.factory.guidance
    words = args.split()
    sub = words[0].lower() if words else ""
    channel, chat = lane.key[0], lane.key[1]
    if sub == "":
        return await _show(host, lane)
    if sub == "list":
        names = ", ".join(guidance.library) or "none"
        return f"Instruction files an approver may choose here (/instructions set NAME): {names}."
    if sub not in ("set", "clear") or (sub == "set") != (len(words) == 2) or len(words) > 2:
        return USAGE
    # Who may choose is the roles' to say (docs/governance.md#roles): by default the
    # admins (the approvers), refused before this is reached (`core.agent.commands`).
    if sub == "clear":
        await host.store.set_instruction_pref(channel, chat, None)
        return "This chat's chosen instructions are cleared (from the next turn on)."
    name = words[1]
    if name not in guidance.library:
        known = ", ".join(guidance.library) or "none"
        return f"There is no instruction file `{name}` in the library (files: {known})."
    await host.store.set_instruction_pref(channel, chat, name)
    file = guidance.library[name]
    return f"This chat now follows {file.path.name} (from the next turn on)."


async def _show(host: LaneHost, lane: Lane) -> str:
    guidance = host.factory.guidance
    lines = []
    if guidance.workspace is not None:
        lines.append(f"Team: {guidance.workspace.path}")
    own = guidance.channels.get(lane.key[0])
    if own is not None:
        lines.append(f"Channel ({lane.key[0]}): {own.path}")
    chosen = await host.chosen_instructions(lane.key)
    if chosen is not None:
        lines.append(f"Chosen for this chat: {guidance.library[chosen].path}")
    skills = ", ".join(s.name for s in guidance.skills) or "none"
    head = "Instructions here:" if lines else "No instruction files apply here."
    return "\n".join([head, *lines, f"Skills: {skills}"])


__all__ = ["instructions_command"]
