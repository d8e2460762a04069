"""Eviction by score for the `subgoal` strategies (docs/context.md#context-strategies).

Compaction cuts the history into blocks (an assistant message with its tool results is one
block: pairs are never split) and gives the summary model the blocks that fit its input
budget, highest score first; the rest is dropped, lowest score first. A block's score is its
subgoal tier's relevance (active 1.0, completed 0.3, outdated 0.1); with `mig` it is the
relevance minus the block's largest redundancy (Jaccard similarity of word sets) with any
higher-scored block, so a repeated output makes room for something new. Blocks of relevance
1.0 (the active subgoal, an earlier summary) are protected: no redundancy is subtracted.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from core.context.tokens import TokenCounter
from core.context.transcript import as_text, clip
from core.messages import Message

PROTECTED = 1.0
OFF_LOOP_BLOCKS = 64  # MIG is O(blocks²): longer histories are scored in a worker thread
_WORD = re.compile(r"\w+")


def blocks(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """`[start, stop)` of each block: an assistant tool-call message with the tool results
    after it, or any other single message."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(messages)
    while i < n:
        j = i + 1
        if messages[i].role == "assistant" and messages[i].tool_calls:
            while j < n and messages[j].role == "tool":
                j += 1
        out.append((i, j))
        i = j
    return out


def word_set(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def mig_scores(relevance: Sequence[float], texts: Sequence[str]) -> list[float]:
    """score = relevance − max redundancy with any higher-scored block, greedily: the best
    remaining block is fixed first, then every other one's redundancy is updated (O(k²))."""
    sets = [word_set(t) for t in texts]
    redundancy = [0.0] * len(texts)
    scores = [0.0] * len(texts)
    remaining = set(range(len(texts)))

    def current(i: int) -> float:
        return relevance[i] if relevance[i] >= PROTECTED else relevance[i] - redundancy[i]

    while remaining:
        best = max(remaining, key=lambda i: (current(i), i))  # ties: the newer block
        scores[best] = current(best)
        remaining.discard(best)
        for i in remaining:
            redundancy[i] = max(redundancy[i], jaccard(sets[best], sets[i]))
    return scores


def block_scores(head: Sequence[Message], relevance: Sequence[float], mig: bool) -> list[float]:
    """One score per block of `head` (`relevance` per message; a block takes its highest)."""
    spans = blocks(head)
    rel = [max(relevance[a:b]) for a, b in spans]
    if not mig:
        return rel
    return mig_scores(rel, [" ".join(m.content for m in head[a:b]) for a, b in spans])


def ranked_render(
    head: Sequence[Message],
    relevance: Sequence[float],
    counter: TokenCounter,
    budget: int,
    mig: bool = False,
) -> str:
    """`head` as text within `budget` tokens: blocks are kept highest score first (ties:
    newest first) and shown in their original order, with what was dropped counted."""
    spans = blocks(head)
    scores = block_scores(head, relevance, mig)
    keep: dict[int, str] = {}
    used = 0
    for k in sorted(range(len(spans)), key=lambda k: (-scores[k], -k)):
        a, b = spans[k]
        cost = sum(counter.message(m) + 8 for m in head[a:b])  # as `render` counts
        if used + cost <= budget:
            keep[k] = "\n\n".join(as_text(m) for m in head[a:b])
            used += cost
        elif not keep and budget - used > 64:  # the best block alone is too big: its start
            keep[k] = clip("\n\n".join(as_text(m) for m in head[a:b]), budget - used - 16)
            used = budget
    chunks: list[str] = []
    dropped = 0
    for k, (a, b) in enumerate(spans):
        if k in keep:
            if dropped:
                chunks.append(f"[{dropped} messages omitted]")
                dropped = 0
            chunks.append(keep[k])
        else:
            dropped += b - a
    if dropped:
        chunks.append(f"[{dropped} messages omitted]")
    return "\n\n".join(chunks)


async def ranked_render_async(
    head: Sequence[Message],
    relevance: Sequence[float],
    counter: TokenCounter,
    budget: int,
    mig: bool = False,
) -> str:
    """`ranked_render`, in a worker thread when the pairwise scoring would be long."""
    if mig and len(blocks(head)) > OFF_LOOP_BLOCKS:
        return await asyncio.to_thread(ranked_render, head, relevance, counter, budget, mig)
    return ranked_render(head, relevance, counter, budget, mig)
