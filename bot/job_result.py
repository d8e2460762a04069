"""What one fire of a scheduled job did (`JobResult`), and the short notice a fire that did
not complete posts."""

from __future__ import annotations

from datetime import datetime

from core.chat import is_silent
from core.records import record


@record(frozen=True, slots=True)
class JobResult:
    """What one fire did. `state` is the run's end state (`completed`, `failed`,
    `cancelled`, `timed_out`, `waiting_on_human`), `skipped` (this fire already ran) or
    `taken_over` (another worker took it over and finishes it)."""

    job: str
    fire_time: datetime
    state: str
    text: str = ""  # what was posted (the answer, or the failure notice)
    delivered: bool = False
    error: str | None = None
    run_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == "completed" and (self.delivered or self.silent)

    @property
    def silent(self) -> bool:
        """The job completed with nothing to post (`[SILENT]`): nothing was meant to arrive."""
        return self.state == "completed" and not self.delivered and is_silent(self.text)

    @property
    def delivery(self) -> str:
        """How `jobs run` and `jobs list` say it: yes, silent or no."""
        return "yes" if self.delivered else "silent" if self.silent else "no"


def failure_notice(job: str, state: str, reason: str) -> str:
    """The short post for a run that did not complete; `reason` is the run's `failure`
    (or its final text when it stopped for another reason)."""
    reason = reason.strip() or state
    if state == "waiting_on_human":
        reason = f"it stopped to ask a question, and a cron job has nobody to answer: {reason}"
    elif state == "timed_out":
        reason = f"it ran out of time: {reason}"
    if len(reason) > 300:
        reason = reason[:299] + "…"
    return f"⚠ Job `{job}` failed: {reason}"


__all__ = ["JobResult", "failure_notice"]
