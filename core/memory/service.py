"""`Memory`: the long-term memory the tools, the automatic recall and `/memory` use, kept
in the store and always read through the scopes of the person asking (`scopes.py`).

A recall that finds nothing above `min_score`, or fails, is logged as a `memory_miss`
event (docs/delegation-memory.md#memory): queued with the events, never
awaited, and never shown to the model or the user — operators mine those for what memory
should have known.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

from core.chat import Asker
from core.memory.scopes import scope_for, visible_scopes

if TYPE_CHECKING:
    from core.eventlog import EventLog
    from core.store import MemoryRow, MemoryStore, ScopeKind

log = logging.getLogger(__name__)

MISS_QUERY_CHARS = 512  # a logged query is cut to this: no unbounded writes
NO_RESULTS = "no_results"


class MemorySettings(Protocol):
    """What memory reads of its configuration (`core.config.MemoryConfig` is one). A
    protocol, not the config class: `ToolContext` names `Memory`, and `core.config`
    imports tool modules, so naming the config class here would close an import cycle."""

    @property
    def auto_recall(self) -> int: ...

    @property
    def min_score(self) -> float: ...

    @property
    def strategy(self) -> str: ...


class Memory:
    """Long-term memory for one process: the store, where misses are logged, the settings."""

    def __init__(
        self, store: MemoryStore, events: EventLog | None, settings: MemorySettings
    ) -> None:
        self.store, self.events, self.settings = store, events, settings

    async def remember(self, text: str, kind: ScopeKind, asker: Asker) -> MemoryRow:
        """Keep `text` in the `kind` scope of `asker` (the memory already there if it holds
        the very same text).

        Raises:
            ScopeNotAllowed: `asker` has no such scope here.
            StoreError: the write failed.
        """
        scope = scope_for(kind, asker)
        for same in await self.store.recall(text, [scope], 5):  # the same note twice is one
            if same.text == text:
                return same
        return await self.store.remember(scope, text, made_by=asker.user_id, conv=asker.conv)

    async def recall(
        self, query: str, asker: Asker, limit: int = 5, kind: ScopeKind | None = None
    ) -> list[MemoryRow] | None:
        """The memories visible to `asker` (of scope `kind` only, if given) most relevant
        to `query`, scoring at least `min_score`; None if the store failed. Either way
        an empty result is logged as a `memory_miss`."""
        scopes = [s for s in visible_scopes(asker) if kind is None or s.kind == kind]
        try:
            hits = await self.store.recall(query, scopes, limit)
        except Exception as exc:  # a broken recall must not end the run: it is a miss
            log.warning("memory recall failed", exc_info=True)
            self._missed(query, asker, f"{type(exc).__name__}: {exc}")
            return None
        hits = [hit for hit in hits if hit.score >= self.settings.min_score]
        if not hits:
            self._missed(query, asker, NO_RESULTS)
        return hits

    def _missed(self, query: str, asker: Asker, error: str) -> None:
        if self.events is None:
            return
        try:
            self.events.emit(
                "memory_miss",
                {
                    "query": query[:MISS_QUERY_CHARS],
                    "strategy": self.settings.strategy,
                    "error": error,
                    "session_id": asker.conv,
                    "ts": time.time(),
                },
                run_id=asker.run_id or None,
                conv=asker.conv or None,
            )
        except Exception:  # operator data: losing one must not fail the recall
            log.warning("could not log a memory miss", exc_info=True)
