"""How the workers sharing one store are set (`[store]` in config.toml) and named."""

from __future__ import annotations

import os
import secrets
import socket

from core.records import record


@record(frozen=True, slots=True)
class SharedSettings:
    """How workers on one store keep track of each other (`[store]` in config.toml).

    Attributes:
        heartbeat: seconds between a worker's heartbeats.
        timeout: a worker not heard from for this long is dead; its runs are taken over.
        sweep: seconds between safety sweeps (dead workers; queued runs a lost notice left).
        max_runs: runs one worker claims at once; more wait for another worker.
        channels: the channels whose conversations any worker may answer (every worker
            has their outbound side); messages of others (the terminal console) are
            answered by the worker that took them in, as in one process.
    """

    heartbeat: float = 2.0
    timeout: float = 10.0
    sweep: float = 5.0
    max_runs: int = 32
    channels: frozenset[str] = frozenset()


def new_worker_id() -> str:
    """`host:pid:random`: unique, and says where the worker runs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
