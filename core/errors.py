"""Parley's one error tree. Vendor exceptions are mapped into it at the edge.

ParleyError
├── ConfigError                 bad config.toml / tools.yaml: names key, problem and fix
├── ProviderError               an LLM call failed (.retryable, .retry_after, .status, .code);
│   │                           HTTP error answers and in-stream error events alike
│   ├── ProviderAuthError       401/403: wrong or missing key; never retried
│   ├── ProviderRateLimited     429; retried honouring Retry-After
│   ├── ProviderUnavailable     5xx, connect/read timeouts, a cut stream; retried
│   └── ContextLengthError      the provider says the prompt is too long (by error code
│                               or message); the loop compacts and retries once
├── ContextLimitExceeded        our own pre-flight estimate is over the hard limit
├── ToolError                   a tool could not run (turned into an error result)
│   ├── ToolValidationError     arguments failed the tool's schema
│   ├── ToolDenied              blocked by policy, blocklist, path rules or an approver
│   ├── ToolTimeout             killed after its timeout; never retried
│   └── ToolTransientError      timeout, refused connection, 429 or 5xx: a tool with HTTP
│                               semantics raises it; idempotent tools are retried
│                               (.retry_after, .status)
├── ChannelError                a chat platform refused or failed a call (.retryable); each
│   │                           adapter maps its SDK's errors here in one function
│   ├── ChannelRateLimited      429 (.retry_after); waited out on the clock and retried
│   ├── ChannelUnavailable      5xx, timeouts, connection trouble; retried with backoff
│   ├── ChannelRefused          any other refusal, e.g. a 4xx (.status, .code: the platform's
│   │                           error code or description); never retried
│   └── DeliveryFailed          a message did not reach the chat: refused, or still failing
│                               after the retries (what a `Responder` raises)
└── StoreError                  a write to the store failed (its statement, not its batch)

Apart from the tree, `FixableError` (a ValueError) is what a config.toml validator raises
when it knows the fix; the loader turns it into the `ConfigError` above.

Every message (and a vendor's `code`) is scrubbed of the configured secrets as the error
is made (`core.secrets`): a provider or platform that echoes a key in its error body
cannot carry it into a log, the store, a chat or the terminal.
"""

from __future__ import annotations

from os import PathLike

from core.secrets import scrub


class ParleyError(Exception):
    """Base of every error Parley raises on purpose."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(scrub(a) if isinstance(a, str) else a for a in args))


class ConfigError(ParleyError):
    """A configuration problem, phrased for a human: which key, what is wrong, how to fix it.

    `source` is the file the key is in. A problem found after the file was read (a user
    that does not exist, a variable that is not set) is raised without one, and whoever
    read the file names it with `in_file` before it is shown: `--config other.toml` is
    named as such, never as `config.toml`.
    """

    def __init__(self, key: str, problem: str, fix: str, *, source: str | None = None) -> None:
        self.key, self.problem, self.fix, self.source = key, problem, fix, source
        super().__init__(self._text())

    def in_file(self, source: str | PathLike[str]) -> ConfigError:
        """Name the file the problem is in, unless it names one already; returns itself."""
        if self.source is None:
            self.source = str(source)
            self.args = (scrub(self._text()),)
        return self

    def _text(self) -> str:
        # "config.toml" only where no caller knew the file (a config parsed from a dict)
        return f"{self.source or 'config.toml'}: `{self.key}`: {self.problem}\n  fix: {self.fix}"


class FixableError(ValueError):
    """A config validator's problem that knows its fix. A ValueError, not a `ParleyError`:
    pydantic reports it at the key it was raised for, and the loader
    (`core.config.load_config`) makes it the `ConfigError`'s problem and fix."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.fix = fix


class ProviderError(ParleyError):
    """An LLM call failed. `retryable` says whether trying again can help; `code` is the
    vendor's error code or type (e.g. "tool_use_failed"), if it sent one."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        retryable: bool | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.code = scrub(code) if code else code
        if retryable is not None:
            self.retryable = retryable


class ProviderAuthError(ProviderError):
    """The provider rejected the credentials (401/403)."""


class ProviderRateLimited(ProviderError):
    """429 Too Many Requests."""

    retryable = True


class ProviderUnavailable(ProviderError):
    """5xx, a timeout, a refused connection or a stream cut short."""

    retryable = True


class ContextLengthError(ProviderError):
    """The provider refused the request because the prompt exceeds its context window."""


class BudgetExceeded(ParleyError):
    """An LLM call was refused by a budget (docs/cost.md#budgets); the message says which,
    what was spent and when it resets."""


class ContextLimitExceeded(ParleyError):
    """The estimated prompt is still above the hard limit after every recovery."""

    def __init__(self, estimated_tokens: int, limit_tokens: int) -> None:
        self.estimated_tokens, self.limit_tokens = estimated_tokens, limit_tokens
        super().__init__(
            f"context limit exceeded: about {estimated_tokens} tokens, limit {limit_tokens}"
        )


class ToolError(ParleyError):
    """A tool could not produce a result. The loop turns it into an error result."""


class ToolValidationError(ToolError):
    """The model's arguments do not fit the tool's schema."""


class ToolDenied(ToolError):
    """Policy, the blocklist, a path boundary or an approver refused the call."""


class ToolTimeout(ToolError):
    """The tool ran past its timeout and its process group was killed."""


class ToolTransientError(ToolError):
    """A failure that may pass if the call is tried again (timeout, refused connection,
    429, 5xx). The executor retries it for idempotent tools, honouring `retry_after`
    (seconds, e.g. from a Retry-After header) when it is longer than the backoff."""

    def __init__(
        self, message: str, *, retry_after: float | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


class ChannelError(ParleyError):
    """A chat platform refused or failed a call. `retryable` says whether trying again can
    help (`channels.retry.call_with_retry` does)."""

    retryable: bool = False


class ChannelRateLimited(ChannelError):
    """429 Too Many Requests: wait `retry_after` seconds, then try again."""

    retryable = True

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        super().__init__(message or f"rate limited; retry after {retry_after:g} s")
        self.retry_after = retry_after


class ChannelUnavailable(ChannelError):
    """A 5xx answer, a timeout or connection trouble: worth trying again after a while."""

    retryable = True


class ChannelRefused(ChannelError):
    """The platform said no: a 4xx other than 429, or an error answer (`{"ok": false}`).
    Asking again would get the same answer. `status` is the HTTP status, if known; `code`
    is the platform's own error code (e.g. `message_not_found`) or, for a platform that
    has none, its error description."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = scrub(code) if code else code


class DeliveryFailed(ChannelError):
    """A message did not reach the chat: the platform refused it (even as plain text), or
    it still failed after the retries. The cause is chained (`__cause__`)."""


class StoreError(ParleyError):
    """A statement could not be written to the store. Only that statement is lost: the
    rest of its group commit is written without it."""
