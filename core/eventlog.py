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

from core.events import (
    EventName,
    EventSink,
    LLMCallStarted,
    LoopEvent,
    Observed,
    StreamDone,
    StreamRestarted,
    TokensEstimated,
    ToolFinished,
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
        self.iteration = 0
        self.input_tokens = self.output_tokens = 0
        self._clock = clock
        self._call_started = 0.0
        self._provider = ""

    def emit(self, name: EventName, data: dict[str, Any] | None = None) -> None:
        if self.tags:
            data = {**(data or {}), **self.tags}
        self.log.emit(name, data, run_id=self.run_id, conv=self.conv, iteration=self.iteration)

    def __call__(self, event: LoopEvent) -> None:
        match event:
            case LLMCallStarted(iteration=iteration, provider=provider, model=model):
                self.iteration = iteration
                self._call_started = self._clock()
                self._provider = f"{provider}/{model}"
            case StreamDone(usage=usage, cost=cost):
                data: dict[str, Any] = {
                    "provider": self._provider,
                    "latency_ms": round((self._clock() - self._call_started) * 1000, 1),
                }
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
                self.emit("agent.llm.retry", {"attempt": attempt, "reason": reason, "delay": delay})
            case ToolFinished(call=call, result=result, duration=duration):
                self.emit(
                    "agent.tool.call",
                    {"tool": call.name, "error": result.is_error, "seconds": round(duration, 3)},
                )
            case Observed(name=name, data=data):
                self.emit(name, dict(data))
            case _:
                pass
        self.forward(event)
