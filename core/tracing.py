"""Traces and the log context of a run (docs/operations.md#traces).

One trace per run: `run_scope` opens the run's span (and tells the log formatter which
run and conversation the current task works for); the run's event sink opens a span per
LLM call and per tool call, the approval desk one per approval wait and the channel
retry layer one per platform call. Attribute names follow the OpenTelemetry GenAI
conventions (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.usage.input_tokens`, …).

Tracing is off unless `enable(tracer)` was called (`parley run` does so when
`[telemetry] otlp_endpoint` is set and the `parley[otel]` extra is installed); off, every
function here costs a global read. This module imports no OpenTelemetry package itself:
the tracer comes from the caller, and spans are used through their duck-typed methods.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("parley_run", default=None)
CONV: contextvars.ContextVar[str | None] = contextvars.ContextVar("parley_conv", default=None)
WORKER = [""]
"""This process's worker id, for log lines (set at start-up)."""

_tracer: list[Any] = [None]  # an opentelemetry.trace.Tracer, once enabled


def enable(tracer: Any) -> None:
    """Trace runs with `tracer` (an OpenTelemetry `Tracer`)."""
    _tracer[0] = tracer


def disable() -> None:
    _tracer[0] = None


class RunTrace:
    """The open spans of one run (LLM calls, tool calls) by key, ended when they finish
    or, at the latest, when the run does."""

    def __init__(self, tracer: Any, span: Any) -> None:
        self.tracer, self.span = tracer, span
        self.open: dict[str, Any] = {}
        context = span.get_span_context()
        self.trace_id = f"{context.trace_id:032x}"

    def start(self, key: str, name: str, attributes: Mapping[str, Any]) -> None:
        """Open a child span of the run, not made current (the loop goes on meanwhile)."""
        from opentelemetry import trace

        parent = trace.set_span_in_context(self.span)
        self.end(key, error="superseded")  # a call that raised before its end
        self.open[key] = self.tracer.start_span(name, context=parent, attributes=dict(attributes))

    def end(
        self, key: str, attributes: Mapping[str, Any] | None = None, error: str | None = None
    ) -> None:
        span = self.open.pop(key, None)
        if span is None:
            return
        if attributes:
            span.set_attributes(dict(attributes))
        if error is not None:
            _set_error(span, error)
        span.end()

    def close(self, error: str | None) -> None:
        for key in list(self.open):
            self.end(key, error="run ended first")
        if error is not None:
            _set_error(self.span, error)


def _set_error(span: Any, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


_RUN: contextvars.ContextVar[RunTrace | None] = contextvars.ContextVar("parley_trace", default=None)


def current_run() -> RunTrace | None:
    """The trace of the run the current task works for (None: not tracing)."""
    return _RUN.get()


@contextlib.contextmanager
def run_scope(run_id: str, conv: str, trigger: str) -> Iterator[RunTrace | None]:
    """The current task works for run `run_id` until the block ends: log lines carry its
    ids, and (tracing on) its span is the parent of what the run does."""
    tokens = (RUN_ID.set(run_id), CONV.set(conv))
    tracer = _tracer[0]
    try:
        if tracer is None:
            yield None
            return
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "parley",
            "gen_ai.conversation.id": conv,
            "parley.run_id": run_id,
            "parley.trigger": trigger,
        }
        with tracer.start_as_current_span("invoke_agent parley", attributes=attributes) as span:
            run = RunTrace(tracer, span)
            token = _RUN.set(run)
            error: str | None = None
            try:
                yield run
            except BaseException as exc:
                error = type(exc).__name__
                raise
            finally:
                run.close(error)
                _RUN.reset(token)
    finally:
        RUN_ID.reset(tokens[0])
        CONV.reset(tokens[1])


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    """A span under the current run's, around the block (nothing outside a traced run)."""
    run = _RUN.get()
    if run is None:
        yield
        return
    from opentelemetry import trace

    parent = trace.set_span_in_context(run.span)
    with run.tracer.start_as_current_span(name, context=parent, attributes=dict(attributes)):
        yield
