"""`[server]`, `[log]` and `[telemetry]`: how an operator watches Parley
(docs/operations.md#operating-parley)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Section):
    """The operator's HTTP endpoint: probes, `/metrics` and the operator's page."""

    listen: str | None = Field(
        None,
        description="`HOST:PORT` to serve /healthz, /readyz, /metrics and the page on; unset: off.",
        examples=["127.0.0.1:9464"],
    )
    admin_token_env: str | None = Field(
        None, description="Env var holding the bearer token of the page; unset: no page."
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str | None) -> str | None:
        if listen is None:
            return None
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(
                f'`{listen}` is not HOST:PORT; write e.g. "127.0.0.1:9464" '
                '(or "0.0.0.0:9464" inside a container)'
            )
        return listen

    def address(self) -> tuple[str, int]:
        """(host, port) of `listen` (a bracketed IPv6 host loses its brackets)."""
        assert self.listen is not None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class LogConfig(_Section):
    format: Literal["text", "json"] = Field(
        "text", description="`json`: one JSON object a line, with run id and conversation."
    )


class TelemetryConfig(_Section):
    """OpenTelemetry traces (the `parley[otel]` extra): one trace per run."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint; unset: no traces.",
        examples=["http://otel-collector:4318/v1/traces"],
    )
    service_name: str = Field("parley", description="`service.name` of the traces.")
