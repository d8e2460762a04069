"""Secret redaction (docs/tools.md): tool output loses known secret values (in any spelling
`core.secrets.encodings` knows: URL-quoted, base64, JSON-escaped, hex) and common token
shapes before it is stored, posted or sent to the model; the model is told.

Every other text that leaves the process is scrubbed by `core.secrets` instead."""

from __future__ import annotations

import re
from collections.abc import Iterable

from core.secrets import MIN_SECRET_LENGTH, encodings, trie_pattern

_SHAPES = "|".join(
    (
        r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack bot/user tokens
        r"xapp-[A-Za-z0-9-]{10,}",  # Slack app-level tokens
        r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI / Anthropic style keys
        r"\b\d{6,12}:[A-Za-z0-9_-]{30,}",  # Telegram bot tokens
        r"\b[MN][A-Za-z\d]{23,27}\.[\w-]{6}\.[\w-]{27,}",  # Discord bot tokens
        r"\bgh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
        r"\bAKIA[0-9A-Z]{16}\b",  # AWS access key ids
    )
)
# Every shape starts with one of these characters: the lookahead lets `re` skip every other
# position with one set test instead of trying seven alternatives there (4x faster on a
# tool output; the same matches).
TOKEN_SHAPES = re.compile(rf"(?=[xsMNgA\d])(?:{_SHAPES})")
MASK = "[REDACTED]"


class Redactor:
    """Masks the given secret values (and their encodings) and anything shaped like a
    token. Values shorter than `MIN_SECRET_LENGTH` are left alone (ordinary words)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if len(s) >= MIN_SECRET_LENGTH}
        spellings = set().union(*(encodings(v) for v in values))
        self._values = re.compile(trie_pattern(spellings)) if spellings else None

    def redact(self, text: str) -> tuple[str, int]:
        """The text with secrets masked, and how many were."""
        count = 0
        if self._values is not None:
            text, n = self._values.subn(MASK, text)
            count += n
        text, n = TOKEN_SHAPES.subn(MASK, text)
        return text, count + n

    def __call__(self, text: str) -> str:
        redacted, count = self.redact(text)
        if not count:
            return text
        plural = "s" if count != 1 else ""
        return f"{redacted}\n[Parley redacted {count} secret{plural} from this output.]"
