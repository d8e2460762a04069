"""Start-up glue for operating Parley (docs/operations.md#operating-parley): metrics and
the operator's endpoint (`[server]`), traces (`[telemetry]`), the worker id in logs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bot.singletons import worker_id
from core import metrics, tracing
from core.errors import ConfigError

if TYPE_CHECKING:
    from bot.app import App
    from bot.server import OpsServer
    from bot.singletons import Singletons
    from channels.base import Channel
    from core.agent import Agent


def admin_token(app: App) -> str | None:
    """The page's bearer token: the value of `[server] admin_token_env` (None, and no
    page, when the key or the variable is unset)."""
    name = app.config.server.admin_token_env
    return (app.environ.get(name) or None) if name else None


def page_note(app: App) -> str:
    """Whether the page is served, for the start-up banner."""
    name = app.config.server.admin_token_env
    if not name:
        return "no operator's page: no [server] admin_token_env"
    if admin_token(app) is None:
        return f"no operator's page: {name} is not set"
    return "the operator's page at /"


def start_telemetry(app: App) -> Any:
    """Trace runs to `[telemetry] otlp_endpoint` (None: not configured); returns the
    tracer provider, to shut down at exit.

    Raises:
        ConfigError: an endpoint is set but the `parley[otel]` extra is not installed.
    """
    settings = app.config.telemetry
    if not settings.otlp_endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(
            "telemetry.otlp_endpoint",
            f"traces need OpenTelemetry, which is not installed ({exc.name})",
            "pip install 'parley[otel]', or remove `otlp_endpoint`",
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(settings.otlp_endpoint)))
    tracing.enable(provider.get_tracer("parley"))
    return provider


def stop_telemetry(provider: Any) -> None:
    if provider is not None:
        tracing.disable()
        provider.shutdown()  # sends what is still batched


async def start_server(
    app: App, agent: Agent, channels: Mapping[str, Channel], leased: Singletons | None
) -> OpsServer | None:
    """The operator's endpoint, listening (None: `[server] listen` is unset). Metrics are
    counted only while it serves them."""
    settings = app.config.server
    if leased is not None:
        tracing.WORKER[0] = leased.worker
    else:
        tracing.WORKER[0] = agent.workers.id if agent.workers is not None else worker_id()
    if not settings.listen:
        return None
    from bot.server import OpsServer

    token = admin_token(app)
    registry = metrics.enable()
    hooks = None
    if app.config.triggers:
        from bot.hooks import Hooks

        hooks = Hooks(app, agent)
    server = OpsServer(
        settings, agent, channels, registry=registry, token=token, leased=leased, hooks=hooks
    )
    try:
        await server.start()
    except OSError as exc:
        metrics.disable()
        raise ConfigError(
            "server.listen",
            f"cannot listen on {settings.listen}: {exc.strerror or exc}",
            "choose a free port (or another address)",
        ) from exc
    return server


async def stop_server(server: OpsServer | None) -> None:
    if server is not None:
        await server.stop()
        metrics.disable()
