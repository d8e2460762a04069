"""Background tasks of the agent whose failures are logged, never lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task whose failure is logged, never lost ("exception was never retrieved")."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s failed", task.get_name(), exc_info=exc)


__all__ = ["spawn"]
