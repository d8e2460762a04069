"""Long-term memories as every backend stores them (docs/delegation-memory.md): the scope a memory
lives in,
the row a store hands back, and the query terms both backends' full-text search match.

A memory belongs to exactly one scope, `(kind, id)`: `("user", "slack:U123")`,
`("conversation", "slack:C1:1700000000.0001")`, `("channel", "slack:C1")` or
`("team", "slack")`. The store filters by the scopes it is given and nothing else; which
scopes a run may see is decided above it (`core.memory.scopes`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal, get_args

from core.records import record

ScopeKind = Literal["user", "conversation", "channel", "team"]
SCOPE_KINDS: tuple[ScopeKind, ...] = get_args(ScopeKind)

MAX_TERMS = 32  # a pasted page as a query must not become a thousand-term OR
_WORD = re.compile(r"\w+")
# Words that would match nearly every memory: without them, a question with no real
# match finds nothing (a miss) instead of whatever shares "the" with it.
_STOPWORD_TEXT = """a about after all also am an and any are as at be been before being but by can
    could did do does doing for from had has have having he her here hers him his how i
    if in into is it its itself just me more most my myself no nor not now of off on once
    only or other our ours out over own same she should so some such than that the their
    theirs them then there these they this those through to too under until up very was
    we were what when where which while who whom why will with would you your yours
    yourself s t don"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


@record(frozen=True, slots=True)
class Scope:
    """Where a memory lives and who may see it: `kind` and the id of that user,
    conversation, channel or team."""

    kind: ScopeKind
    id: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"


@record(frozen=True, slots=True)
class MemoryRow:
    """One memory.

    Attributes:
        id: the store's id, what `/memory forget ID` takes.
        scope: where it lives.
        text: what was remembered.
        created_at: Unix time.
        made_by: the platform user id of who asked for it ("" for none, e.g. a cron job).
        conv: the conversation it was made in.
        score: relevance in a recall, 0 (none) to 1 (exclusive); 0 in a listing.
    """

    id: int
    scope: Scope
    text: str
    created_at: float
    made_by: str
    conv: str
    score: float = 0.0


MEMORY_COLUMNS = "id, scope_kind, scope_id, text, created_at, made_by, conv"


def memory_columns(table: str) -> str:
    """`MEMORY_COLUMNS` of `table` (for a join)."""
    return ", ".join(f"{table}.{c.strip()}" for c in MEMORY_COLUMNS.split(","))


def memory_row(row: Sequence[Any], score: float = 0.0) -> MemoryRow:
    """A `MemoryRow` from the `MEMORY_COLUMNS` of a row."""
    kind = str(row[1])
    if kind not in SCOPE_KINDS:
        raise ValueError(f"memory {row[0]} has an unknown scope kind {kind!r}")
    return MemoryRow(
        int(row[0]),
        Scope(kind, str(row[2])),
        str(row[3]),
        float(row[4]),
        str(row[5]),
        str(row[6]),
        score,
    )


def query_terms(query: str) -> list[str]:
    """The words of `query` a full-text recall looks for: lower case, no stop words, each
    once, at most `MAX_TERMS`. Only word characters: safe to quote into FTS5 and
    `to_tsquery` syntax."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if word not in STOPWORDS and word not in seen:
            seen[word] = None
            if len(seen) == MAX_TERMS:
                break
    return list(seen)


def scope_filter(
    scopes: Sequence[Scope], placeholder: str, table: str = ""
) -> tuple[str, list[str]]:
    """SQL that keeps rows (of `table`, if given) in one of `scopes` (none for no scopes),
    and its parameters."""
    if not scopes:
        return "1 = 0", []
    of = f"{table}." if table else ""
    clause = " OR ".join(
        f"({of}scope_kind = {placeholder} AND {of}scope_id = {placeholder})" for _ in scopes
    )
    params = [value for scope in scopes for value in (scope.kind, scope.id)]
    return f"({clause})", params


__all__ = [
    "MEMORY_COLUMNS",
    "SCOPE_KINDS",
    "MemoryRow",
    "Scope",
    "ScopeKind",
    "memory_columns",
    "memory_row",
    "query_terms",
    "scope_filter",
]
