"""Provider failover (docs/providers.md#failover): a turn goes on on the next provider when
its own fails past its retries.

`FailoverProvider` wraps a conversation's provider (the channel's choice, `/provider`) and
its `[providers.NAME] fallbacks`, in order. A retryable failure that outlived the provider's
own retries (overloaded, 5xx, a refused or cut connection, a timeout, a rate limit) sends
the call to the next candidate; anything else (a bad request, a refused key, a context too
long) is the provider's answer and is raised as it is.

* The continuation is clean: each provider encodes the neutral history in its own wire
  format, and reasoning blocks made by another provider (Anthropic's signed thinking) are
  dropped from what it is sent (`strip_foreign_reasoning`); the history keeps them.
* A `CircuitBreaker` per provider, shared by all conversations of a worker (`Breakers`),
  keeps a failing provider out for `cooldown_secs`, then lets one call through (half-open):
  its success closes the breaker, its failure opens it again.
* The fallback is per turn: the channel's preference is never changed; once a turn failed
  over it stays on the fallback until it ends, and the next turn starts again from the
  channel's provider (unless its breaker is open).
* When no candidate is left, the call waits `no_providers_backoff_secs` (a visible notice)
  and fails with `NoProvidersAvailable`, which names every provider tried and why.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import field
from typing import Literal

from pydantic import BaseModel, Field

from core.clock import Clock, SystemClock
from core.errors import ProviderError
from core.events import (
    EventSink,
    Notice,
    Observed,
    ReasoningDelta,
    StreamDone,
    StreamEvent,
    StreamRestarted,
    TextDelta,
    ToolCallDelta,
)
from core.messages import Message
from core.providers.base import Provider, ProviderSettings, complete
from core.records import record
from core.sections import SECTION_CONFIG
from core.tools.base import ToolSpec

BreakerState = Literal["closed", "open", "half_open"]
OUTPUT = (TextDelta, ReasoningDelta, ToolCallDelta)


class FailoverSettings(BaseModel):
    """`[failover]`: the circuit breaker and the wait when no provider is left."""

    model_config = SECTION_CONFIG

    cooldown_secs: float = Field(
        30.0, gt=0, description="How long a failed provider is kept out before one probe."
    )
    failure_threshold: int = Field(
        1, ge=1, description="Failed calls (each past its own retries) that open the breaker."
    )
    no_providers_backoff_secs: float = Field(
        2.0, ge=0, description="Wait when every provider is out, before the turn fails."
    )


class NoProvidersAvailable(ProviderError):
    """Every provider of the turn failed or is kept out by its breaker."""


@record(slots=True)
class CircuitBreaker:
    """closed → (threshold failures) → open → (cooldown) → half-open: one probe call;
    its success closes, its failure opens again. Time comes from `clock`."""

    cooldown: float
    threshold: int
    clock: Clock
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False

    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        if self.clock.monotonic() - self.opened_at < self.cooldown or self.probing:
            return "open"
        return "half_open"

    def allow(self) -> bool:
        """Whether a call may go; in half-open state the first caller is the probe."""
        state = self.state()
        if state == "half_open":
            self.probing = True
        return state != "open"

    def success(self) -> None:
        self.failures, self.opened_at, self.probing = 0, None, False

    def failure(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = self.clock.monotonic()
        self.probing = False


@record(slots=True)
class Breakers:
    """The breakers of one worker, by provider name (shared by its conversations)."""

    settings: FailoverSettings = field(default_factory=FailoverSettings)
    clock: Clock = field(default_factory=SystemClock)
    _by_name: dict[str, CircuitBreaker] = field(default_factory=dict)

    def of(self, name: str) -> CircuitBreaker:
        if name not in self._by_name:
            s = self.settings
            self._by_name[name] = CircuitBreaker(s.cooldown_secs, s.failure_threshold, self.clock)
        return self._by_name[name]

    def describe(self) -> list[str]:
        """`name: state` of each breaker that is not closed."""
        return [f"{n}: {b.state()}" for n, b in self._by_name.items() if b.state() != "closed"]


def strip_foreign_reasoning(
    messages: Sequence[Message], target: str, *, native: bool = False
) -> list[Message]:
    """`messages` as `target` may be sent them: reasoning made by another provider is
    dropped (its signed blocks mean nothing, or an error, elsewhere). Messages of unknown
    origin (made without failover) count as the `native` provider's: the channel's own."""
    out: list[Message] = []
    for m in messages:
        own = m.origin == target or (native and not m.origin)
        foreign = m.role == "assistant" and not own
        if foreign and (m.reasoning_blocks or m.reasoning):
            m = m.with_changes(reasoning_blocks=(), reasoning="")
        out.append(m)
    return out


class FailoverProvider:
    """A conversation's provider with its fallbacks (see the module doc). `Provider`."""

    def __init__(
        self, primary: Provider, fallbacks: Sequence[Provider], breakers: Breakers
    ) -> None:
        self.primary = primary
        self.fallbacks = list(fallbacks)
        self.breakers = breakers
        self.current: Provider = primary  # this turn's provider
        self.turn_note: str | None = None  # "openai (anthropic: HTTP 529 …)" once failed over

    @property
    def name(self) -> str:
        return self.primary.name

    @property
    def model(self) -> str:
        return self.primary.model

    @property
    def settings(self) -> ProviderSettings:
        return self.primary.settings

    def begin_turn(self) -> None:
        """A new turn starts from the channel's provider again."""
        self.current, self.turn_note = self.primary, None

    async def aclose(self) -> None:
        """The wrapped providers are shared (the application closes them)."""

    def _candidates(self) -> list[Provider]:
        chain = [self.primary, *self.fallbacks]
        return chain[chain.index(self.current) :]

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        sink: EventSink | None = None,
    ) -> StreamDone:
        """One whole assistant turn: each event to `sink` (with the failover's own
        notices and observations), the `StreamDone`."""
        return await complete(self._run(messages, tools, sink), sink)

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """`Provider.stream` on the first provider that can give the turn."""
        return self._run(messages, tools, None)

    async def _run(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], sink: EventSink | None
    ) -> AsyncGenerator[StreamEvent, None]:
        tried: list[str] = []
        for provider in self._candidates():
            breaker = self.breakers.of(provider.name)
            if not breaker.allow():
                tried.append(f"{provider.name} (kept out after recent failures)")
                continue
            native = provider is self.primary
            request = strip_foreign_reasoning(messages, provider.name, native=native)
            shown = False
            try:
                async with contextlib.aclosing(provider.stream(request, tools)) as events:
                    async for event in events:
                        if isinstance(event, StreamDone):
                            breaker.success()
                            self._served_by(provider, tried)
                            yield _tagged(event, provider.name)
                            return
                        if isinstance(event, StreamRestarted):
                            shown = False  # its own retry: the channel starts afresh
                        shown = shown or isinstance(event, OUTPUT)
                        yield event
            except ProviderError as exc:
                if not exc.retryable:
                    breaker.success()  # it answered: up, whatever it thought of the request
                    raise
                breaker.failure()
                tried.append(f"{provider.name} ({_short(exc)})")
                yield self._failed(sink, provider.name, exc, shown, len(tried))
            except BaseException:
                breaker.probing = False  # a cancelled probe proves nothing: the next one tries
                raise
        await self._none_left(tried, sink)

    def _served_by(self, provider: Provider, tried: list[str]) -> None:
        self.current = provider  # the rest of the turn stays here
        if provider is not self.primary and tried:
            self.turn_note = f"{provider.name} ({'; '.join(tried)})"

    def _failed(
        self, sink: EventSink | None, name: str, exc: ProviderError, shown: bool, attempt: int
    ) -> StreamRestarted:
        chain = [p.name for p in self._candidates()]
        later = chain[chain.index(name) + 1 :] if name in chain else []
        to = later[0] if later else None
        reason = f"{name} failed ({_short(exc)})" + (f"; continuing on {to}" if to else "")
        data = {"from": name, "to": to, "reason": _short(exc), "discarded": shown}
        if sink is not None:
            sink(Observed("agent.provider.failover", data))
        # Channels drop what the failed attempt showed, as for a retry.
        return StreamRestarted(attempt, reason, 0.0, shown)

    async def _none_left(self, tried: list[str], sink: EventSink | None) -> None:
        wait = self.breakers.settings.no_providers_backoff_secs
        names = ", ".join(tried) or self.primary.name
        if sink is not None:
            sink(
                Notice(
                    f"No LLM provider is available (tried {names}); waiting {wait:g}s.", "warning"
                )
            )
            sink(Observed("agent.provider.unavailable", {"tried": tried, "wait": wait}))
        await self.breakers.clock.sleep(wait)
        raise NoProvidersAvailable(
            f"no LLM provider is available right now (tried {names}). Please try again in a minute."
        )


def _short(exc: ProviderError) -> str:
    return str(exc).splitlines()[0][:160]


def _tagged(done: StreamDone, name: str) -> StreamDone:
    """The answer, marked with the provider that made it (its reasoning is only that
    provider's to read back)."""
    message = done.message.with_changes(origin=name)
    return StreamDone(message, done.stop_reason, done.usage)
