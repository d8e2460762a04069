"""The one mapping from what goes wrong talking to an LLM to `core.errors`.

An error is sorted by its code (or type) first, then by HTTP status, and only then by its
message: one table for HTTP error answers and in-stream error events alike. Transport
failures (timeouts, refused or cut connections, a body that is not an event stream) are
mapped by `map_transport_errors`, as httpx2 maps httpcore2's.

What the server said is scrubbed of the configured secrets before it is cut to length: a
gateway that echoes the key in its error body leaves no piece of it behind.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx2
from httpx2 import SSEError

from core.errors import (
    ContextLengthError,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)
from core.secrets import scrub

CONTEXT_LENGTH_CODES = frozenset({"context_length_exceeded"})
AUTH_CODES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
RATE_LIMIT_CODES = frozenset(
    {"rate_limit_exceeded", "rate_limit_error", "rate_limited", "requests", "tokens"}
)
UNAVAILABLE_CODES = frozenset(
    {
        "server_error",
        "api_error",
        "internal_error",
        "internal_server_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
        "timeout",
    }
)
CONTEXT_LENGTH_MARKERS = (
    "context_length",
    "context length",
    "maximum context",
    "maximum context length",
    "prompt is too long",
    "too many tokens",
    "exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
    "exceeds the context window",  # OpenAI Responses: "Your input exceeds the context window"
    "context_length_exceeded",
)


def error_from_response(status: int, body: str, headers: httpx2.Headers) -> ProviderError:
    """Map an HTTP error answer to our error tree."""
    return provider_error(
        f"HTTP {status}",
        _error_object(scrub(body)),
        status=status,
        retry_after=_retry_after(headers),
    )


def error_from_event(provider: str, error: dict[str, Any]) -> ProviderError:
    """Map an error sent inside a stream (an `error` event, a `{"error": {...}}` chunk, a
    failed response) to our error tree. `error` is the vendor's error object."""
    return provider_error(provider, error)


def malformed_event(provider: str, data: str) -> ProviderUnavailable:
    """An event that is not the JSON it should be: a broken stream, worth a retry."""
    return ProviderUnavailable(f"{provider} sent a malformed stream event: {scrub(data)[:200]}")


def provider_error(
    where: str,
    error: dict[str, Any],
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """The one mapping from a vendor's error object to our tree, with the server's own words
    (its message, its code, and what the model tried if Groq says so) as the message.

    Args:
        where: what the message starts with ("HTTP 400", the provider's name).
        error: `{"message", "type", "code", ...}`; an int `code` is an HTTP status, as
            OpenRouter sends it.
        status: the HTTP status, if the error came as an HTTP answer.
        retry_after: seconds from a Retry-After header.
    """
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int) and not isinstance(code, bool):
        status, code = status or code, None
    said = scrub(str(error.get("message") or error.get("reason") or kind or error))[:500]
    labels = {str(v).lower() for v in (code, kind) if v}
    error_cls = _error_class(labels, status, said)
    text = f"{where}: {said}"
    if isinstance(code, str) and code and code not in said:
        text += f" ({code})"
    if failed := error.get("failed_generation"):
        text += f"\nfailed_generation: {scrub(str(failed))[:300]}"
    label = str(code or kind) if code or kind else None
    return error_cls(text, status=status, retry_after=retry_after, code=label)


def _error_class(labels: set[str], status: int | None, said: str) -> type[ProviderError]:
    """A context-overflow code first, then the code or type and the HTTP status (auth, rate
    limit, server trouble), and only then the server's message."""
    if labels & CONTEXT_LENGTH_CODES:
        return ContextLengthError
    if status in (401, 403) or labels & AUTH_CODES:
        return ProviderAuthError
    if status == 429 or labels & RATE_LIMIT_CODES:
        return ProviderRateLimited
    if status in (408, 409, 425) or (status or 0) >= 500 or labels & UNAVAILABLE_CODES:
        return ProviderUnavailable
    if any(marker in said.lower() for marker in CONTEXT_LENGTH_MARKERS):
        return ContextLengthError
    return ProviderError


def _error_object(body: str) -> dict[str, Any]:
    """The error object of an HTTP error body (OpenAI, Anthropic and plainer shapes)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {"message": body[:500] or "(empty body)"}
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return error
    return {"message": str(error)}


def _retry_after(headers: httpx2.Headers) -> float | None:
    for key, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(key)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # an HTTP date: fall back to our own backoff
    return None


@contextlib.contextmanager
def map_transport_errors(provider: str, pool_size: int | None = None) -> Iterator[None]:
    """Raise httpx2 failures (transport and SSE) inside the block as `ProviderUnavailable`."""
    try:
        yield
    except httpx2.PoolTimeout as exc:
        raise ProviderUnavailable(
            f"all {pool_size} connections to {provider} stayed busy until the timeout "
            f"(raise providers.{provider}.max_connections): {exc!r}"
        ) from exc
    except httpx2.TimeoutException as exc:
        raise ProviderUnavailable(f"timed out talking to {provider}: {exc!r}") from exc
    except (httpx2.TransportError, SSEError) as exc:
        raise ProviderUnavailable(f"connection to {provider} failed: {exc!r}") from exc
