"""The kinds of run a trigger's delivery queues (the `trigger` column of its runs), apart
so the dispatcher knows them without loading the triggers' configuration."""

from __future__ import annotations

from typing import Final

TRIGGER_KIND: Final = "trigger"  # a model run: the prompt and the payload's external block
POST_KIND: Final = "post"  # a run that posts its text as it is (deliver_only, closing lines)
THREAD_CHANNEL: Final = "trigger"  # the channel part of a trigger conversation's key

__all__ = ["POST_KIND", "THREAD_CHANNEL", "TRIGGER_KIND"]
