"""Request bodies as JSON text, each message's and each tool list's part encoded once.

A conversation sends its whole history with every LLM call, and it grows by a message or
two per call: encoding every message again made JSON the largest single cost of a tool
iteration (~13 % of its CPU at 20 tool results). Messages are frozen, so the JSON of one
is cached on it (per wire format), and a tool list's on its tuple; a request's body is
then joined from the cached parts and only the new messages are encoded.

A wire format's `build_body` returns a plain dict whose large values may be `Raw` (JSON
text) or `RawList` (a JSON array of such texts); `encode_body` writes the dict out.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, cast

from core.messages import Message
from core.tools.base import ToolSpec

_encoder = json.JSONEncoder(separators=(",", ":"))  # ASCII-only, as httpx's `json=` was
dumps = _encoder.encode

TOOL_LISTS_KEPT = 32  # tool lists (per wire format) whose JSON is kept: configs × job subsets


class Raw(str):
    """JSON text, written into a body as it is."""

    __slots__ = ()


class RawList(list[Raw]):
    """A JSON array of `Raw` items; an empty item stands for nothing."""

    __slots__ = ()


def encode_body(body: dict[str, Any]) -> bytes:
    """The body as UTF-8 JSON, `Raw` and `RawList` values written as they are."""
    parts = []
    for key, value in body.items():
        if isinstance(value, RawList):
            text = "[" + ",".join(item for item in value if item) + "]"
        elif isinstance(value, Raw):
            text = value
        else:
            text = dumps(value)
        parts.append(f"{dumps(key)}:{text}")
    return ("{" + ",".join(parts) + "}").encode()


def message_json(wire: str, message: Message, convert: Callable[[Message], Any]) -> Raw:
    """`convert(message)` as JSON, encoded once per wire format and kept on the message.

    A converter that returns a list (a message that is several items, or none) is written
    without its brackets, so it joins into the array around it."""
    cache = message._json
    if cache is None:
        cache = {}
        object.__setattr__(message, "_json", cache)  # a cache on a frozen message
    text = cache.get(wire)
    if text is None:
        value = convert(message)
        encoded = dumps(value)
        cache[wire] = text = Raw(encoded[1:-1] if isinstance(value, list) else encoded)
    return cast(Raw, text)  # only `Raw` is stored


class ToolListCache:
    """The JSON of a tool list, per list (the registry hands out one tuple per config)."""

    def __init__(self, convert: Callable[[ToolSpec], Any]) -> None:
        self._convert = convert
        self._kept: OrderedDict[int, tuple[Sequence[ToolSpec], Raw]] = OrderedDict()

    def __call__(self, tools: Sequence[ToolSpec]) -> Raw:
        kept = self._kept.get(id(tools))
        if kept is not None and kept[0] is tools:
            self._kept.move_to_end(id(tools))
            return kept[1]
        text = Raw(dumps([self._convert(t) for t in tools]))
        if isinstance(tools, tuple):  # a list could change under the same id
            self._kept[id(tools)] = (tools, text)
            if len(self._kept) > TOOL_LISTS_KEPT:
                self._kept.popitem(last=False)
        return text


__all__ = ["Raw", "RawList", "ToolListCache", "dumps", "encode_body", "message_json"]
