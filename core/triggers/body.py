"""The body-size rule of a webhook: refuse early, and never read more than the limit.

Two checks, because a sender may lie or say nothing: `length_verdict` decides from the
`Content-Length` header before a byte is read (413 at once when it is over the limit, 400
when it is not a length), and `read_capped` reads the body chunk by chunk and stops as
soon as the total passes `max_body_bytes`, so a body over the limit (chunked, or longer
than it announced) is never read to its end nor held in memory. docs/triggers.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Literal

LengthVerdict = Literal["read", "too_large", "invalid"]


def length_verdict(content_length: str | None, max_body_bytes: int) -> LengthVerdict:
    """What to do before reading, from the `Content-Length` header (None when absent).

    "read": no length, or one within the limit; the read is still capped by `read_capped`.
    "too_large": the announced length is over the limit; answer 413 without reading.
    "invalid": the header is not a non-negative decimal integer; answer 400.
    """
    if content_length is None:
        return "read"
    text = content_length.strip()
    # int() would also take "+5", "1_000" and other spellings HTTP does not allow.
    if not text.isdigit() or not text.isascii():
        return "invalid"
    return "too_large" if int(text) > max_body_bytes else "read"


async def read_capped(chunks: AsyncIterable[bytes], max_body_bytes: int) -> bytes | None:
    """The whole body, or None as soon as it passes `max_body_bytes` (answer 413).

    Reading stops at the first chunk that takes the total over the limit: the rest of
    the stream is left unread, and the caller closes the connection.
    """
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > max_body_bytes:
            return None
        parts.append(chunk)
    return b"".join(parts)
