"""Prometheus metrics (docs/operations.md#metrics): a few functions the choke points call.

Every function here is a no-op (one global read) until `enable()` is called, which
`parley run` does only when `[server] listen` is set; `prometheus_client` is imported then,
not before. Labels stay bounded: platform, channel type, provider, model, tool name,
state, kind — never a user id, a conversation id or a run id.

Fed from: the events log (`core.eventlog.EventLog.emit`: run states, compactions, loop
guards, leases, cron fires), the run's event sink (`RunEvents`: LLM calls, time to first
token, tokens, tool calls), the provider call in `core.loop`, the channel retry layer
(`channels.retry`), the store's group commit, worker heartbeats and the approval desk.
Values that are a state, not a count (queue depth, running lanes, leases held), are read
when scraped, from callbacks the application registers (`gauges`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

RUN_STATES = {
    "agent_run.queued": "queued",
    "agent_run.running": "running",
    "agent_run.completed": "completed",
    "agent_run.cancelled": "cancelled",
    "agent_run.failed": "failed",
    "agent_run.timed_out": "timed_out",
    "agent_run.waiting_on_human": "waiting_on_human",
    "agent_run.paused": "paused",
    "agent_run.lost": "lost",
    "agent_run.skipped": "skipped",
    "agent_run.requeued": "requeued",
    "agent_run.resumed": "resumed",
}
"""Run events counted in `parley_runs_total` by the state they report."""
PLATFORMS = frozenset({"slack", "discord", "telegram", "console"})
GaugeSource = Callable[[], Iterable[tuple[str, str, Mapping[str, str], float]]]
"""Yields (metric name, help, labels, value) when scraped."""


def error_kind(exc: BaseException) -> str:
    """A provider failure as a bounded label."""
    from core.errors import (
        ContextLengthError,
        ProviderAuthError,
        ProviderRateLimited,
        ProviderUnavailable,
    )

    for cls, kind in (
        (ProviderRateLimited, "rate_limited"),
        (ProviderUnavailable, "unavailable"),
        (ProviderAuthError, "auth"),
        (ContextLengthError, "context_length"),
    ):
        if isinstance(exc, cls):
            return kind
    return "other"


def channel_of(conv: str | None) -> str:
    """The channel type of a conversation id (`telegram:42` → `telegram`): bounded."""
    if not conv:
        return "none"
    kind = conv.split(":", 1)[0]
    return kind if kind in PLATFORMS else "other"


class _Metrics:
    """The metric objects of one registry (a fresh one per `enable`, so tests start at 0)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = r = CollectorRegistry()
        self.sources: list[GaugeSource] = []
        self._kids: dict[tuple[Any, ...], Any] = {}  # labelled children: labels() is slow
        self.runs = Counter("parley_runs", "Run state changes.", ["state", "channel"], registry=r)
        self.runs_started = Counter(
            "parley_runs_started",
            "Runs started (a turn: trigger=user).",
            ["channel", "trigger"],
            registry=r,
        )
        self.llm_calls = Counter(
            "parley_llm_calls", "LLM calls answered.", ["provider", "model"], registry=r
        )
        self.llm_errors = Counter(
            "parley_llm_errors", "LLM call failures by kind.", ["provider", "kind"], registry=r
        )
        self.llm_seconds = Histogram(
            "parley_llm_call_seconds",
            "Whole LLM call latency.",
            ["provider", "model"],
            registry=r,
            buckets=(0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
        )
        self.llm_ttft = Histogram(
            "parley_llm_time_to_first_token_seconds",
            "Time to the first streamed token.",
            ["provider", "model"],
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30),
        )
        self.llm_tokens = Counter(
            "parley_llm_tokens",
            "Tokens by type (input, cached, output).",
            ["provider", "model", "type"],
            registry=r,
        )
        self.cost = Counter(
            "parley_llm_cost_usd", "Priced usage in US dollars.", ["provider", "model"], registry=r
        )
        self.trigger_deliveries = Counter(
            "parley_trigger_deliveries",
            "Webhook deliveries by trigger and outcome (accepted, duplicate, ignored, "
            "unauthorized, too_large, rate_limited, invalid).",
            ["trigger", "outcome"],
            registry=r,
        )
        self.tool_calls = Counter(
            "parley_tool_calls", "Tool calls.", ["tool", "outcome", "category"], registry=r
        )
        self.tool_seconds = Histogram(
            "parley_tool_call_seconds",
            "Tool call duration.",
            ["tool"],
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300),
        )
        self.approvals = Counter(
            "parley_approvals",
            "Approvals asked, granted, denied, timed out.",
            ["outcome"],
            registry=r,
        )
        self.compactions = Counter(
            "parley_compactions", "Context compactions by stage.", ["stage"], registry=r
        )
        self.guard_stops = Counter(
            "parley_loop_guard_stops", "Loop guards that fired.", ["guard"], registry=r
        )
        self.channel_calls = Counter(
            "parley_channel_api_calls",
            "Platform API calls (each try).",
            ["platform", "outcome"],
            registry=r,
        )
        self.channel_retries = Counter(
            "parley_channel_api_retries",
            "Platform API calls tried again, and why.",
            ["platform", "why"],
            registry=r,
        )
        self.store_commit = Histogram(
            "parley_store_commit_seconds",
            "Store group commit latency.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )
        self.store_failed = Counter("parley_store_failed_writes", "Failed writes.", registry=r)
        self.heartbeats = Counter(
            "parley_worker_heartbeats", "Worker heartbeats by outcome.", ["outcome"], registry=r
        )
        self.lease_changes = Counter(
            "parley_lease_changes",
            "Leases taken, lost, released.",
            ["lease", "change"],
            registry=r,
        )
        self.cron = Counter(
            "parley_cron_fires", "Cron fires by job and outcome.", ["job", "outcome"], registry=r
        )
        r.register(_Gauges(self.sources))

    def kid(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered (the labels are bounded, so is this)."""
        key = (id(metric), *labels)
        child = self._kids.get(key)
        if child is None:
            child = self._kids[key] = metric.labels(*labels)
        return child

    def event(self, name: str, data: Mapping[str, Any], conv: str | None) -> None:
        if (state := RUN_STATES.get(name)) is not None:
            self.kid(self.runs, state, channel_of(conv)).inc()
        elif name == "agent_run.started":
            self.kid(self.runs_started, channel_of(conv), str(data.get("trigger", ""))).inc()
        elif name == "agent.compaction.run":
            self.kid(self.compactions, str(data.get("kind", "compact"))).inc()
        elif name == "agent.recovery.fired":
            self.kid(self.compactions, "recovery").inc()
        elif name == "agent.loop.detected":
            if data.get("stops"):
                self.kid(self.guard_stops, "loop").inc()
        elif name == "agent.exhaustion.hard_limit":
            self.kid(self.guard_stops, "hard_limit").inc()
        elif name == "agent.exhaustion.soft_limit":
            self.kid(self.guard_stops, "soft_limit").inc()
        elif name.startswith("lease."):
            change = name.removeprefix("lease.")
            self.kid(self.lease_changes, str(data.get("lease", "")), change).inc()
        elif name == "job.finished":
            self.kid(self.cron, str(data.get("job", "")), str(data.get("state", ""))).inc()
        elif name == "job.skipped":
            self.kid(self.cron, str(data.get("job", "")), "skipped").inc()


class _Gauges:
    """A collector reading the registered sources when scraped."""

    def __init__(self, sources: list[GaugeSource]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, GaugeMetricFamily] = {}
        for source in self.sources:
            for name, help_text, labels, value in source():
                family = families.get(name)
                if family is None:
                    family = GaugeMetricFamily(name, help_text, labels=list(labels))
                    families[name] = family
                family.add_metric(list(labels.values()), value)
        yield from families.values()


_m: _Metrics | None = None


def enable() -> CollectorRegistry:
    """Start counting (from zero) into a new registry, which is returned for `/metrics`."""
    global _m
    _m = _Metrics()
    return _m.registry


def disable() -> None:
    global _m
    _m = None


def enabled() -> bool:
    return _m is not None


def gauges(source: GaugeSource) -> None:
    """Read `source` at each scrape (queue depth, running lanes, leases held)."""
    if _m is not None:
        _m.sources.append(source)


def event(name: str, data: Mapping[str, Any], conv: str | None) -> None:
    """An events-log event (`EventLog.emit`)."""
    if _m is not None:
        _m.event(name, data, conv)


def llm_call(provider: str, model: str, seconds: float, tokens: Mapping[str, int]) -> None:
    """An LLM call answered in `seconds`, with its tokens by type (input, cached, output)."""
    if (m := _m) is None:
        return
    m.kid(m.llm_calls, provider, model).inc()
    m.kid(m.llm_seconds, provider, model).observe(seconds)
    for kind, count in tokens.items():
        if count:
            m.kid(m.llm_tokens, provider, model, kind).inc(count)


def llm_first_token(provider: str, model: str, seconds: float) -> None:
    if (m := _m) is not None:
        m.kid(m.llm_ttft, provider, model).observe(seconds)


def llm_error(provider: str, kind: str) -> None:
    """A failed LLM call: `kind` is a small fixed word (rate_limited, unavailable, auth,
    context_length, retried, other)."""
    if (m := _m) is not None:
        m.kid(m.llm_errors, provider, kind).inc()


def llm_cost(provider: str, model: str, usd: float) -> None:
    """Priced usage of one call, where usage is priced (the seam for cost metrics)."""
    if (m := _m) is not None and usd > 0:
        m.kid(m.cost, provider, model).inc(usd)


def tool_call(tool: str, outcome: str, category: str, seconds: float) -> None:
    if (m := _m) is not None:
        m.kid(m.tool_calls, tool, outcome, category).inc()
        m.kid(m.tool_seconds, tool).observe(seconds)


def trigger_delivery(trigger: str, outcome: str) -> None:
    """One delivery a trigger answered (docs/triggers.md#operating-triggers)."""
    if (m := _m) is not None:
        m.kid(m.trigger_deliveries, trigger, outcome).inc()


def approval(outcome: str) -> None:
    """asked, granted, denied or timed_out."""
    if (m := _m) is not None:
        m.kid(m.approvals, outcome).inc()


def channel_call(platform: str, outcome: str) -> None:
    """One try of a platform API call: ok, rate_limited, unavailable or refused."""
    if (m := _m) is not None:
        m.kid(m.channel_calls, platform, outcome).inc()


def channel_retry(platform: str, why: str) -> None:
    if (m := _m) is not None:
        m.kid(m.channel_retries, platform, why).inc()


def store_commit(seconds: float) -> None:
    if (m := _m) is not None:
        m.store_commit.observe(seconds)


def store_failed_write() -> None:
    if (m := _m) is not None:
        m.store_failed.inc()


def heartbeat(ok: bool) -> None:
    if (m := _m) is not None:
        m.kid(m.heartbeats, "ok" if ok else "failed").inc()
