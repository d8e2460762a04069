"""`/memory`: what the bot remembers here, and forgetting it.

    /memory              the memories a recall could return here, newest first
    /memory forget ID    forget one (if it is in a scope of the asking person)
    /memory forget all   forget this conversation's

The listing follows the recall rule (`scopes.py`): in a channel, the person's own
memories are not listed, since everyone there reads the reply.
"""

from __future__ import annotations

from core.chat import Asker
from core.memory.scopes import visible_scopes, writable_scopes
from core.store import MemoryStore, Scope

LISTED = 50
SHOWN_CHARS = 80
USAGE = "Usage: /memory [forget ID | forget all]"
_MAX_ID = 2**63 - 1  # both backends' ids are 64-bit


async def memory_command(store: MemoryStore, asker: Asker, args: str) -> str:
    """The reply to `/memory args` from `asker`."""
    words = args.split()
    if not words:
        return await _listing(store, asker)
    if words[0].lower() != "forget" or len(words) != 2:
        return USAGE
    target = words[1].lower().lstrip("#")
    if target == "all":
        count = await store.forget_memories(Scope("conversation", asker.conv))
        return f"Forgot {count} memor{'y' if count == 1 else 'ies'} of this conversation."
    if not target.isdigit() or int(target) > _MAX_ID:
        return USAGE
    if await store.forget_memory(int(target), writable_scopes(asker)):
        return f"Forgot #{target}."
    return f"There is no memory #{target} that you can forget here."


async def _listing(store: MemoryStore, asker: Asker) -> str:
    rows = await store.memories(visible_scopes(asker), LISTED)
    lines = [f"Memories here (newest first, at most {LISTED}):" if rows else "No memories here."]
    for row in rows:
        text = " ".join(row.text.split())
        if len(text) > SHOWN_CHARS:
            text = text[: SHOWN_CHARS - 1] + "…"
        lines.append(f"#{row.id} [{row.scope.kind}] {text}")
    if not asker.is_dm and asker.user_id:
        lines.append("Your personal memories are listed only in a direct message with me.")
    if rows:
        lines.append("/memory forget ID forgets one; /memory forget all this conversation's.")
    return "\n".join(lines)
