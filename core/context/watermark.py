"""Telling "only appends happened" from any other change to a message list, in O(1)."""

from __future__ import annotations

from core.messages import Message


class Watermark:
    """Remembers a list by identity (object, length, first and last message) to tell
    "only appends happened since" (returns the old length) from anything else (0)."""

    __slots__ = ("_first", "_last", "_list", "_n")

    def __init__(self) -> None:
        self._list: list[Message] | None = None
        self._n = 0
        self._first: Message | None = None
        self._last: Message | None = None

    def appended_from(self, messages: list[Message]) -> int:
        n = self._n
        if messages is not self._list or n == 0 or len(messages) < n:
            return 0
        if messages[0] is not self._first or messages[n - 1] is not self._last:
            return 0
        return n

    def mark(self, messages: list[Message]) -> None:
        self._list, self._n = messages, len(messages)
        self._first = messages[0] if messages else None
        self._last = messages[-1] if messages else None

    def reset(self) -> None:
        self._list, self._n = None, 0
