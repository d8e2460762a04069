"""The process's secrets, and their removal from every text that leaves the process.

Parley fills one registry (`SECRETS`) at start-up with every secret value its
configuration names: API keys, bot and app tokens, the store password, `tools.yaml` `env:`
values (and anything else through `add`). `scrub` then replaces each value with
`[redacted:NAME]`, also when it is spelled the way an error body, a URL or a log line
might carry it: lower- or upper-cased, URL-quoted, base64 (standard and URL-safe,
wherever it starts in the encoded text), JSON-escaped (once or twice) and hex (either
case).

The edges call it: the mapping of provider and channel errors into `core.errors`, every
`ParleyError`'s message, the store's writes, the events log, channel posts, the log
handlers (`RedactingFilter`) and the terminal (`ScrubbingStream`).

All spellings live in one precompiled regex, shaped as a trie (a position of the text
costs one test per distinct first character, not one per spelling). It runs only on text
that holds a spelling: a short text is searched with it, a long one is first ruled out
by `in` per spelling (C, skipping ahead), and one shorter than every spelling at once. A
clean text comes back as the same object.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from typing import IO, Any
from urllib.parse import quote, quote_plus

MIN_SECRET_LENGTH = 8
"""Shorter values are not registered: masking them would mask ordinary words."""

_PERCENT = re.compile(r"%[0-9A-F]{2}")


def encodings(value: str) -> set[str]:
    """The spellings of `value` a text may carry it in: raw (also in lower and in upper
    case), URL-quoted (`quote`, path-safe `quote`, `quote_plus`, lower-case escapes),
    JSON-escaped (ASCII or not, `\\/`, and escaped twice: a JSON body quoted inside
    another), hex of its UTF-8 (lower and upper case), and base64.

    A base64 encoding of a longer text holds `value` at one of three alignments; for each,
    only the characters that encode nothing but `value`'s own bits are kept, so the
    needle is found wherever the secret sat in what was encoded."""
    # SDKs reword errors (PTB lower-cases Telegram's); a tool may print it upper-cased
    spellings = {value, value.lower(), value.upper()}
    for quoted in (quote(value, safe=""), quote(value), quote_plus(value)):
        spellings |= {quoted, _PERCENT.sub(lambda m: m.group().lower(), quoted)}
    once = {json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    once |= {s.replace("/", "\\/") for s in once}
    spellings |= once | {json.dumps(s)[1:-1] for s in once}
    raw = value.encode()
    spellings |= {raw.hex(), raw.hex().upper()}  # `xxd -p`/`od` and `%02X` spell it both ways
    for align in range(3):
        encoded = base64.b64encode(b"\0" * align + raw).decode()
        start, end = -(-8 * align // 6), 8 * (align + len(raw)) // 6
        fragment = encoded[start:end]
        spellings |= {fragment, fragment.replace("+", "-").replace("/", "_")}
    return {s for s in spellings if len(s) >= MIN_SECRET_LENGTH}


def trie_pattern(needles: Iterable[str]) -> str:
    """One regex alternation of `needles`, factored as a trie (longest match first)."""
    root: dict[str, Any] = {}
    for needle in needles:
        node = root
        for char in needle:
            node = node.setdefault(char, {})
        node[""] = {}
    return _branch(root)


def _branch(node: dict[str, Any]) -> str:
    """The pattern below `node`; a chain of single children is one literal (no recursion
    per character, so a long key cannot exhaust the stack)."""
    parts = []
    for char in sorted(c for c in node if c):
        literal, child = [char], node[char]
        while len(child) == 1 and "" not in child:
            (next_char,) = child
            literal.append(next_char)
            child = child[next_char]
        parts.append(re.escape("".join(literal)) + _branch(child))
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    if "" in node:  # a needle ends here; a longer one may go on
        return f"(?:{body})?"
    return body


LONG_TEXT = 256
"""From this length on, `str.__contains__` per needle (C, skipping ahead by the needle's
length) rules a clean text out faster than the regex, which looks at every character."""


class _Matcher:
    """The spellings of the registered secrets (spelling -> name) and their one regex."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.needles = sorted(names, key=len, reverse=True)
        self.shortest = len(self.needles[-1])
        self.regex = re.compile(trie_pattern(names))

    def scrub(self, text: str) -> str:
        if len(text) < self.shortest:
            return text
        if len(text) < LONG_TEXT:
            if self.regex.search(text) is None:
                return text
        elif not any(needle in text for needle in self.needles):
            return text
        names = self.names
        return self.regex.sub(lambda m: f"[redacted:{names.get(m.group(), 'secret')}]", text)


class SecretRegistry:
    """Secret values by name, and the one regex that finds any of their spellings."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}  # value -> name
        self._matcher: _Matcher | None = None
        self._lock = threading.Lock()

    def add(self, name: str, value: str | None) -> None:
        """Register `value` (a secret called `name`, e.g. its environment variable);
        values shorter than `MIN_SECRET_LENGTH` and ones already known are ignored."""
        self.add_all([(name, value)])

    def add_all(self, secrets: Iterable[tuple[str, str | None]]) -> None:
        """`add` each `(name, value)`, building the regex once."""
        with self._lock:
            names = dict(self._matcher.names) if self._matcher is not None else {}
            for name, raw in secrets:
                value = (raw or "").strip()
                if len(value) < MIN_SECRET_LENGTH or value in self._values:
                    continue
                self._values[value] = name
                for spelling in encodings(value):
                    names.setdefault(spelling, name)
            if names and (self._matcher is None or len(names) != len(self._matcher.names)):
                self._matcher = _Matcher(names)  # one assignment: readers see old or new

    def names(self) -> list[str]:
        """The names of the registered secrets (never their values)."""
        return sorted(set(self._values.values()))

    def clear(self) -> None:
        """Forget every secret (tests)."""
        with self._lock:
            self._values, self._matcher = {}, None

    def scrub(self, text: str) -> str:
        """`text` with every spelling of every secret replaced by `[redacted:NAME]`; the
        same object when it holds none."""
        matcher = self._matcher
        return text if matcher is None else matcher.scrub(text)

    def scrub_params(self, params: Sequence[Any]) -> Sequence[Any]:
        """Statement parameters with every string scrubbed (the same sequence if none
        changed)."""
        matcher = self._matcher
        if matcher is None or not isinstance(params, list | tuple):
            return params
        # One look at all of them (no spelling holds a NUL, so none spans two).
        joined = "\0".join(p for p in params if isinstance(p, str))
        if matcher.scrub(joined) is joined:
            return params
        return [matcher.scrub(p) if isinstance(p, str) else p for p in params]


SECRETS = SecretRegistry()
"""The process's registry, filled from the configuration at start-up."""


def scrub(text: str) -> str:
    """`SECRETS.scrub(text)`."""
    return SECRETS.scrub(text)


class RedactingFilter(logging.Filter):
    """Put on a log handler: the record's message, exception text and stack leave with
    every registered secret redacted (the record is changed in place, for every handler
    after this one too)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message)
        if clean is not message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


def redact_log_handlers(logger: logging.Logger | None = None) -> None:
    """Put a `RedactingFilter` on every handler of `logger` (default: the root logger)
    that has none yet."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


class ScrubbingStream:
    """A text stream (stdout, stderr) whose every write is scrubbed first; everything
    else is the wrapped stream's. A secret cut across two writes is not seen: whole
    messages (errors, tables, log lines) are written at once."""

    def __init__(self, stream: IO[str]) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        return self.wrapped.write(scrub(text))

    def writelines(self, lines: Iterable[str]) -> None:
        self.wrapped.writelines(scrub(line) for line in lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
