"""`[log] format = "json"`: one JSON object a line (docs/operations.md#logs).

Each line has `time` (UTC, ISO 8601), `level`, `logger`, `message`, and — when the line
was written for a run — `run_id` and `conv`, plus `worker` (this process's worker id) and
`exc` for a traceback. Secrets are scrubbed as in text lines: the handler's
`RedactingFilter` runs before this formatter, and the whole line is scrubbed again.
Message texts stay out of info lines by the loggers' own rule (docs/operations.md#logs).
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from core import tracing
from core.secrets import scrub


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if (run_id := tracing.RUN_ID.get()) is not None:
            line["run_id"] = run_id
        if (conv := tracing.CONV.get()) is not None:
            line["conv"] = conv
        if tracing.WORKER[0]:
            line["worker"] = tracing.WORKER[0]
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return scrub(json.dumps(line, ensure_ascii=False, default=str))


def use_json_lines(logger: logging.Logger | None = None) -> None:
    """Every handler of `logger` (default: the root logger) writes JSON lines."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())
