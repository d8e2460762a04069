"""The `[store]` section of config.toml: where Parley keeps its durable state (one SQLite
file, or a PostgreSQL database that several workers share) and how those workers keep
time with each other: heartbeats, leases, sweeps (docs/scale-out.md).

`core.config.CoreConfig` holds it as `store`; `core.store.open_store` opens its `target()`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from core.errors import ConfigError, FixableError
from core.sections import SECTION_CONFIG
from core.store.backends import parse_target


class StoreConfig(BaseModel):
    """Where conversations, runs and events are kept: one SQLite file (the default), or a
    PostgreSQL database that several workers share (docs/scale-out.md)."""

    model_config = SECTION_CONFIG

    path: Path = Field(Path("~/.parley/parley.db"), description="SQLite database (WAL).")
    url: str | None = Field(
        None,
        description="Instead of `path`: `sqlite:///<path>` or `postgresql://USER@HOST:PORT/DB`.",
        examples=["postgresql://parley@db.internal:5432/parley"],
    )
    password_env: str | None = Field(None, description="Env var holding the database password.")
    events_log: Path | None = Field(
        Path("~/.parley/events.jsonl"), description="Structured events as JSON lines."
    )
    lease_seconds: float = Field(
        10.0,
        ge=1.0,
        le=300.0,
        description="PostgreSQL only: how long a worker's hold on a singleton (a chat "
        "platform's one connection, the scheduler) lasts unless renewed; renewed every third "
        "of it, so a dead holder is replaced within about this long.",
    )
    # Several workers on one PostgreSQL store (docs/scale-out.md); unused on SQLite.
    heartbeat_seconds: float = Field(
        2.0, gt=0, le=60, description="Seconds between a worker's heartbeats (PostgreSQL)."
    )
    worker_timeout_seconds: float = Field(
        10.0, gt=0, description="A worker silent this long is dead; its runs are taken over."
    )
    sweep_seconds: float = Field(
        5.0, gt=0, le=300, description="Seconds between sweeps for dead workers and lost work."
    )
    worker_max_runs: int = Field(32, ge=1, description="Runs one worker claims at once.")

    @field_validator("url")
    @classmethod
    def _a_known_store(cls, url: str | None) -> str | None:
        if not url:
            return None  # `url = ""`: unset
        try:
            parse_target(url)
        except ConfigError as exc:
            raise FixableError(exc.problem, exc.fix) from exc
        return url

    @model_validator(mode="after")
    def _one_store(self) -> StoreConfig:
        if self.url is not None and "path" in self.model_fields_set:
            raise FixableError("both `path` and `url` are set", "keep one of them")
        if self.worker_timeout_seconds < 2 * self.heartbeat_seconds:
            raise FixableError(
                f"`worker_timeout_seconds` ({self.worker_timeout_seconds:g}) is less than two "
                f"heartbeats ({self.heartbeat_seconds:g} s each): live workers would be "
                "taken for dead",
                "make `worker_timeout_seconds` at least 2 × `heartbeat_seconds` (5 × is safer)",
            )
        return self

    def backend(self) -> Literal["sqlite", "postgresql"]:
        """Which store this is."""
        return "sqlite" if self.url is None else parse_target(self.url)[0]

    def resolved(self) -> Path:
        """The SQLite database file: `url`'s if it is a `sqlite:///` URL, else `path`."""
        if self.url is not None and self.backend() == "sqlite":
            return Path(os.path.expanduser(parse_target(self.url)[1])).resolve()
        return Path(os.path.expanduser(self.path)).resolve()

    def target(self) -> str | Path:
        """What `core.store.open_store` opens: the SQLite file or the PostgreSQL URL."""
        if self.url is None or self.backend() == "sqlite":
            return self.resolved()
        return parse_target(self.url)[1]

    def password(self, environ: Mapping[str, str]) -> str | None:
        """The database password, from the variable `password_env` names (if set)."""
        return environ.get(self.password_env) if self.password_env else None

    def shared(self) -> bool:
        """Several workers may share this store (PostgreSQL): singletons are leased."""
        return self.backend() == "postgresql"

    def resolved_events(self) -> Path | None:
        return Path(os.path.expanduser(self.events_log)).resolve() if self.events_log else None
