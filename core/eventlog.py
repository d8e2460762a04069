"""Structured events (docs/operations.md): JSON lines in a log file and rows in the store.

Every event carries its run id, conversation key and iteration. `RunEvents` is the sink of
one run: it forwards every loop event to the reply stream and turns the ones worth keeping
(`Observed`, LLM call latency and usage, tool calls) into events. Tool arguments and
results are never logged: they may hold secrets. What is logged is scrubbed of the
configured secrets (`core.secrets`; the store scrubs its own rows).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from core import metrics, tracing
from core.events import (
    EventName,
    EventSink,
    LLMCallStarted,
    LoopEvent,
    Observed,
    ReasoningDelta,
    StreamDone,
    StreamRestarted,
    TextDelta,
    TokensEstimated,
    ToolCallDelta,
    ToolFinished,
    ToolStarted,
    Usage,
)
from core.secrets import scrub
from core.store import Store

log = logging.getLogger(__name__)


class EventLog:
    """Where events go: a JSON-lines file (optional) and the store's `events` table."""

    def __init__(self, store: Store | None, path: Path | None = None) -> None:
        self.store = store
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8", buffering=1)

    def emit(
        self,
        name: EventName,
        data: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        conv: str | None = None,
        iteration: int | None = None,
    ) -> None:
        at = time.time()
        payload = data or {}
        metrics.event(name, payload, conv)
        if self._file is not None:
            record = {"at": round(at, 3), "event": name, "run_id": run_id, "conv": conv}
            record.update(iteration=iteration, **payload)
            try:
                self._file.write(scrub(json.dumps(record, default=str)) + "\n")
            except (OSError, ValueError):  # a full disk must not end the run
                log.warning("could not write the events log", exc_info=True)
        if self.store is not None:
            self.store.add_event(
                name, payload, run_id=run_id, conv=conv, iteration=iteration, at=at
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class RunEvents:
    """The sink of one run: forwards to `forward`, records what matters in `log`."""

    def __init__(
        self,
        log: EventLog,
        forward: EventSink,
        *,
        run_id: str,
        conv: str,
        clock: Callable[[], float] = time.perf_counter,
        tags: dict[str, Any] | None = None,
    ) -> None:
        self.log, self.forward = log, forward
        self.run_id, self.conv = run_id, conv
        self.tags = tags or {}  # added to every event's data (a child's parent_run_id)
        self.trace = tracing.current_run()  # this run's trace, when tracing is on
        if self.trace is not None:
            self.tags = {**self.tags, "trace_id": self.trace.trace_id}
        self.iteration = 0
        self.input_tokens = self.output_tokens = 0
        self._clock = clock
        self._call_started = 0.0
        self._provider = ""
        self._model = ("", "")  # (provider, model) of the call in flight
        self._first_token = True  # the call in flight has streamed something already
        self._categories: dict[str, str] = {}  # tool call id → its category, while it runs

    def emit(self, name: EventName, data: dict[str, Any] | None = None) -> None:
        if self.tags:
            data = {**(data or {}), **self.tags}
        self.log.emit(name, data, run_id=self.run_id, conv=self.conv, iteration=self.iteration)

    def __call__(self, event: LoopEvent) -> None:
        """The channel hears of `event` first, then it is recorded: a tool's end or a
        chunk of text reaches the person without waiting on the event log's write (also
        when the channel's side fails)."""
        try:
            self.forward(event)
        finally:
            self._record(event)

    def _record(self, event: LoopEvent) -> None:
        match event:
            case TextDelta() | ReasoningDelta() | ToolCallDelta():
                if not self._first_token:
                    self._first_token = True
                    metrics.llm_first_token(*self._model, self._clock() - self._call_started)
            case LLMCallStarted(iteration=iteration, provider=provider, model=model):
                self.iteration = iteration
                self._call_started = self._clock()
                self._provider = f"{provider}/{model}"
                self._model = (provider, model)
                self._first_token = False
                if self.trace is not None:
                    self.trace.start("llm", f"chat {model}", _llm_attributes(provider, model))
            case StreamDone(usage=usage, cost=cost, stop_reason=stop_reason):
                seconds = self._clock() - self._call_started
                if self.trace is not None:
                    self.trace.end("llm", _usage_attributes(usage, stop_reason))
                data: dict[str, Any] = {
                    "provider": self._provider,
                    "latency_ms": round(seconds * 1000, 1),
                }
                metrics.llm_call(*self._model, seconds, _tokens(usage))
                if usage is not None:
                    self.input_tokens += usage.input_tokens
                    self.output_tokens += usage.output_tokens
                    data.update(
                        input_tokens=usage.input_tokens,
                        output_tokens=usage.output_tokens,
                        estimated=usage.estimated,
                    )
                    if usage.cached_tokens or usage.cache_write_tokens:  # docs/cost.md
                        data.update(
                            cached_tokens=usage.cached_tokens,
                            cache_write_tokens=usage.cache_write_tokens,
                        )
                if cost is not None:
                    data["cost_usd"] = round(cost, 8)
                    metrics.llm_cost(*self._model, cost)
                self.emit("agent.llm.call", data)
            case TokensEstimated(usage=usage):
                self.input_tokens += usage.input_tokens
                self.output_tokens += usage.output_tokens
                self.emit(
                    "agent.llm.usage",
                    {
                        "input_tokens": usage.input_tokens,
                        "output_tokens": usage.output_tokens,
                        "estimated": True,
                    },
                )
            case StreamRestarted(attempt=attempt, reason=reason, delay=delay):
                metrics.llm_error(self._model[0], "retried")
                self._first_token = False  # the retry's first token is timed anew
                self.emit("agent.llm.retry", {"attempt": attempt, "reason": reason, "delay": delay})
            case ToolStarted(call=call, category=category):
                self._categories[call.id] = category
                if self.trace is not None:
                    attributes = {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": call.name,
                        "gen_ai.tool.call.id": call.id,
                        "parley.tool.category": category,
                    }
                    self.trace.start(call.id, f"execute_tool {call.name}", attributes)
            case ToolFinished(call=call, result=result, duration=duration):
                category = self._categories.pop(call.id, "")
                outcome = "error" if result.is_error else "ok"
                metrics.tool_call(call.name, outcome, category, duration)
                if self.trace is not None:
                    error = "the tool failed" if result.is_error else None
                    self.trace.end(call.id, {"parley.tool.outcome": outcome}, error)
                self.emit(
                    "agent.tool.call",
                    {"tool": call.name, "error": result.is_error, "seconds": round(duration, 3)},
                )
            case Observed(name=name, data=data):
                self.emit(name, dict(data))
            case _:
                pass


def _tokens(usage: Usage | None) -> dict[str, int]:
    """A call's tokens by type for `parley_llm_tokens` (cached: where the usage says)."""
    if usage is None:
        return {}
    cached = getattr(usage, "cached_tokens", 0) or 0  # once providers report cache reads
    return {"input": usage.input_tokens, "cached": cached, "output": usage.output_tokens}


def _llm_attributes(provider: str, model: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": model,
    }


def _usage_attributes(usage: Usage | None, stop_reason: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"gen_ai.response.finish_reasons": [stop_reason]}
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
    return attributes
