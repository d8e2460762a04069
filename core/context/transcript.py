"""Transcript repair and shaping (docs/context.md): keep a history acceptable to every provider.

Providers reject a history where a tool call has no result, a result has no call
(an "orphan", e.g. after compaction dropped its assistant message), or an assistant
message is empty: one bad message fails the whole request with a 400/422. The rules:

* the system message (if any) is first;
* each assistant tool call gets exactly one result, in the block of tool messages right
  after that assistant message; a missing one gets a synthetic error result;
* duplicate results and orphaned results are dropped;
* an assistant message with no content and no tool calls is dropped.

It also holds the pure helpers compaction uses to cut a history (`tail_start`,
`latest_user`) and to turn its older part into text (`render`, `truncation_summary`,
`pinned_results`).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.context.tokens import TokenCounter
from core.messages import Message, ToolCall
from core.records import record

MISSING_RESULT = "error: no result was recorded for this call (interrupted)"
SUMMARY_HEADER = "[Summary of earlier conversation]"
PINNED_HEADER = "[Latest result of each tool, pinned]"
CHARS_PER_TOKEN = 4  # for cutting text to a token budget without tokenizing it again


@record(slots=True)
class Repair:
    """The repaired history and what was changed to get it."""

    messages: list[Message]
    synthesized: int = 0
    dropped: int = 0
    moved: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.synthesized or self.dropped or self.moved)


def _empty_assistant(message: Message) -> bool:
    return message.role == "assistant" and not message.tool_calls and not message.content.strip()


def is_valid(messages: Sequence[Message]) -> bool:
    """Whether `messages` already satisfies every rule (nothing to repair)."""
    return valid_from(messages, 0)


def valid_from(messages: Sequence[Message], start: int) -> bool:
    """Check the rules for `messages[start:]`, given that `messages[:start]` is valid.

    `start` must be 0 or the length of a prefix that was itself valid: such a prefix ends
    with a complete block, so the check can begin afresh there (O(new messages)).
    """
    n = len(messages)
    system_first = n > 0 and messages[0].role == "system"
    i = start
    while i < n:
        m = messages[i]
        if m.role == "tool" or _empty_assistant(m):
            return False
        if m.role == "system" and not system_first:
            return False
        i += 1
        if m.role != "assistant" or not m.tool_calls:
            continue
        wanted = {call.id for call in m.tool_calls}
        if len(wanted) != len(m.tool_calls):
            return False
        while i < n and messages[i].role == "tool":
            call_id = messages[i].tool_call_id
            if call_id not in wanted:  # orphan or duplicate
                return False
            wanted.discard(call_id)
            i += 1
        if wanted:
            return False
    return True


def _unique_calls(message: Message) -> tuple[Message, int]:
    """The assistant message without repeated call ids (providers reject them)."""
    seen: dict[str, ToolCall] = {}
    for call in message.tool_calls:
        seen.setdefault(call.id, call)
    if len(seen) == len(message.tool_calls):
        return message, 0
    fixed = Message(
        role="assistant",
        content=message.content,
        tool_calls=tuple(seen.values()),
        reasoning=message.reasoning,
        reasoning_blocks=message.reasoning_blocks,
    )
    return fixed, len(message.tool_calls) - len(seen)


def _system_first(messages: Sequence[Message]) -> tuple[list[Message], int]:
    src = list(messages)
    for i, m in enumerate(src):
        if m.role == "system":
            if i > 0:
                src.insert(0, src.pop(i))
                return src, 1
            break
    return src, 0


def repair_transcript(messages: Sequence[Message]) -> Repair:
    """Return a valid history; valid input comes back as the same message objects.

    Idempotent: repairing the result again changes nothing.
    """
    src, moved = _system_first(messages)
    out: list[Message] = []
    repair = Repair(out, moved=moved)
    i, n = 0, len(src)
    while i < n:
        m = src[i]
        i += 1
        if m.role == "tool" or _empty_assistant(m):
            repair.dropped += 1  # an orphaned result, or an assistant turn with nothing in it
            continue
        if m.role != "assistant" or not m.tool_calls:
            out.append(m)
            continue
        m, duplicates = _unique_calls(m)
        repair.dropped += duplicates
        out.append(m)
        wanted = {call.id for call in m.tool_calls}
        answered: set[str] = set()
        while i < n and src[i].role == "tool":
            call_id = src[i].tool_call_id
            if call_id in wanted and call_id not in answered:
                answered.add(call_id)
                out.append(src[i])
            else:
                repair.dropped += 1
            i += 1
        for call in m.tool_calls:
            if call.id not in answered:
                out.append(Message.tool_result(call, MISSING_RESULT, is_error=True))
                repair.synthesized += 1
    return repair


# ---- shaping a transcript for compaction ------------------------------------------------


def clip(text: str, tokens: int) -> str:
    limit = max(0, tokens) * CHARS_PER_TOKEN
    return text if len(text) <= limit else text[:limit] + " …[cut]"


def is_summary(message: Message) -> bool:
    return message.role == "user" and message.content.startswith(SUMMARY_HEADER)


def tail_start(body: Sequence[Message], keep: int) -> int:
    """Index where the verbatim tail starts: moved earlier past tool results so an
    assistant tool-call message is never separated from its results."""
    start = max(0, len(body) - keep)
    while start > 0 and body[start].role == "tool":
        start -= 1
    return start


def latest_user(body: Sequence[Message]) -> int | None:
    for i in range(len(body) - 1, -1, -1):
        if body[i].role == "user" and not is_summary(body[i]):
            return i
    return None


def as_text(m: Message) -> str:
    """One message as plain text for the summarizer."""
    if m.role == "tool":
        status = ", error" if m.is_error else ""
        return f"TOOL RESULT ({m.name or 'tool'}{status}): {m.content}"
    calls = "".join(f"\n  [called {c.name}({clip(c.arguments, 50)})]" for c in m.tool_calls)
    return f"{m.role.upper()}: {m.content}{calls}"


def render(head: Sequence[Message], counter: TokenCounter, budget: int) -> str:
    """The head as text within `budget` tokens; the oldest messages are cut first."""
    chunks: list[str] = []
    used = 0
    for m in reversed(head):
        cost = counter.message(m) + 8  # role label and separators
        if used + cost > budget:
            if not chunks:  # even the newest message alone is too big: keep its start
                chunks.append(clip(as_text(m), budget - used - 16))
            break
        chunks.append(as_text(m))
        used += cost
    omitted = len(head) - len(chunks)
    chunks.reverse()
    if omitted:
        chunks.insert(0, f"[{omitted} older messages omitted]")
    return "\n\n".join(chunks)


def truncation_summary(head: Sequence[Message], budget: int) -> str:
    """A deterministic summary of what was dropped, used when no LLM summary is possible."""
    counts = {"user": 0, "assistant": 0, "tool": 0}
    tools: dict[str, None] = {}
    requests: list[str] = []
    earlier = ""
    for m in head:
        if is_summary(m):
            earlier = m.content.removeprefix(SUMMARY_HEADER).strip()
            continue
        if m.role in counts:
            counts[m.role] += 1
        if m.role == "tool" and m.name:
            tools[m.name] = None
        if m.role == "user" and m.content.strip():
            requests.append(m.content.strip().splitlines()[0][:200])
    used_tools = f" (tools: {', '.join(tools)})" if tools else ""
    lines = [
        f"(Automatic summary unavailable: {len(head)} earlier messages were dropped: "
        f"{counts['user']} user, {counts['assistant']} assistant, "
        f"{counts['tool']} tool results{used_tools}.)"
    ]
    if earlier:
        lines.append("Earlier summary (cut): " + clip(earlier, budget // 2))
    if requests:
        lines.append("Earlier user requests (first line of each):")
        lines += [f"- {r}" for r in requests[-20:]]
    return "\n".join(lines)


def pinned_results(head: Sequence[Message], each: int, budget: int) -> list[str]:
    """The latest successful result of each distinct tool as plain text, newest first,
    within `each` tokens per tool and `budget` in all.

    Plain text, not tool results: the calls they answer are gone from the history.
    """
    names = {c.id: c.name for m in head for c in m.tool_calls}
    latest: dict[str, Message] = {}
    for m in head:
        if m.role != "tool" or m.is_error or m.content.lower().startswith("error"):
            continue  # a failed result pinned as "what you know" would mislead
        name = m.name or names.get(m.tool_call_id or "", "tool")
        latest.pop(name, None)  # re-insert: dict order is then recency order
        latest[name] = m
    out: list[str] = []
    for name, m in reversed(latest.items()):
        if budget <= 0:
            break
        text = clip(m.content, min(each, budget))
        budget -= len(text) // CHARS_PER_TOKEN + 8
        out.append(f"### {name}\n{text}")
    return [PINNED_HEADER, *out] if out else []
