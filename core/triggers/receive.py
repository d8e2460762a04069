"""One webhook delivery taken in (docs/triggers.md#what-a-delivery-becomes), whatever
carries it: verified, rate-counted, decided, and — accepted — stored with its runs in one
transaction before the sender hears 2xx. The HTTP route is `bot.hooks`; `decide` is also
what `parley triggers test` shows.

The order is the cheap refusals first: the signature (401, nothing stored: an unverified
body may carry a forged delivery id), the shared rate (429; counted in the store, so every
worker sees one count), the body as JSON (400), then the event type and the filter
(ignored deliveries are recorded, so a redelivery is still a duplicate), then the
acceptance: the delivery's row, its thread's conversation and its queued runs, all in one
commit (`TriggerStore.accept_delivery`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from typing import Any

from core.records import record
from core.store.trigger_rows import Acceptance, TriggerDelivery, TriggerStore
from core.triggers.config import TriggerConfig
from core.triggers.kinds import POST_KIND, THREAD_CHANNEL, TRIGGER_KIND
from core.triggers.template import external_block
from core.triggers.verify import Rejected, Verified, verify

PAYLOAD_CAP = 16_000  # characters of the payload the model sees, in its external block
KEY_CAP = 200  # characters of a thread key kept (longer keys are cut, with a warning)


@record(frozen=True, slots=True)
class Decision:
    """What a verified payload comes to, before anything is stored.

    `accepted` False: `why` says why it is ignored. Else `text` is the run's user message
    (the quoted prompt and the external data block) or, for `deliver_only`, the message
    posted; `thread_key` the correlation key (None: a thread of its own), `closes` whether
    `close_on` holds, `header` the line that opens a new thread, and `warnings` what the
    templates found missing."""

    accepted: bool
    why: str = ""
    text: str = ""
    thread_key: str | None = None
    closes: bool = False
    header: str = ""
    warnings: tuple[str, ...] = ()


@record(frozen=True, slots=True)
class Answer:
    """What the sender is told (`status`, `text`, `retry_after` seconds for a 429), what it
    counts as (`outcome`, the metric's label), and for the log and the audit only: `why`
    (a rejected signature's reason, never sent), the conversation and runs it started and
    the templates' warnings."""

    status: int
    outcome: str
    text: str
    why: str = ""
    delivery_id: str = ""
    event_type: str = ""
    retry_after: int | None = None
    conv: str | None = None
    run_ids: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def decide(
    name: str, trigger: TriggerConfig, verified: Verified, payload: Mapping[str, Any], body: bytes
) -> Decision:
    """The event, filter, thread key, `close_on` and text of one verified payload."""
    event = verified.event_type
    if trigger.events and event not in trigger.events:
        return Decision(False, f"the event type `{event or '(none)'}` is not in `events`")
    condition = trigger.expr("filter")
    if condition is not None and not condition.matches(payload):
        return Decision(False, f"the filter does not hold ({condition.text})")
    warnings: list[str] = []
    key = thread_key(trigger, payload, warnings)
    closing = trigger.expr("close_on")
    closes = key is not None and closing is not None and closing.matches(payload)
    if trigger.deliver_only:
        template = trigger.template("message")
        assert template is not None  # the model requires it
        rendered = template.render(payload)
        text = rendered.text
    else:
        template = trigger.template("prompt")
        assert template is not None
        rendered = template.render(payload, quote=True)
        data = external_block(body.decode("utf-8", "replace"), trigger.source, PAYLOAD_CAP)
        about = f"(trigger `{name}`, event `{event or 'none'}`, delivery `{verified.delivery_id}`)"
        text = f"{rendered.text}\n\n{about}\n\n{data}"
    warnings.extend(rendered.warnings)
    header = f"[{name}] {key}" if key is not None else f"[{name}] {event or name}"
    return Decision(True, "", text, key, closes, header, tuple(warnings))


def thread_key(
    trigger: TriggerConfig, payload: Mapping[str, Any], warnings: list[str]
) -> str | None:
    """The rendered `thread_by` key, or None (a thread of its own): a key with a missing
    field would put unrelated events in one thread, so it correlates nothing."""
    template = trigger.template("thread_by")
    if template is None:
        return None
    rendered = template.render(payload)
    key = " ".join(rendered.text.split())
    if rendered.warnings or not key:
        warnings.extend(rendered.warnings)
        warnings.append(
            "thread_by: the key is empty or has a missing field; this delivery gets a thread "
            "of its own"
        )
        return None
    if len(key) > KEY_CAP:
        warnings.append(f"thread_by: the key is cut to {KEY_CAP} characters")
        key = key[:KEY_CAP]
    return key


async def receive(
    name: str,
    trigger: TriggerConfig,
    secrets: list[str],
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    store: TriggerStore,
) -> Answer:
    """Take one delivery of trigger `name` in (see the module doc). `headers` with
    lower-case names."""
    verdict = verify(trigger.source, secrets, dict(headers), body, now)
    if isinstance(verdict, Rejected):
        return Answer(401, "unauthorized", "unauthorized", why=verdict.reason)
    ids = verdict.delivery_id, verdict.event_type
    minute = int(now // 60)
    if await store.count_delivery(name, minute) > trigger.rate_per_minute:
        wait = max(1, math.ceil((minute + 1) * 60 - now))
        return Answer(429, "rate_limited", "rate limited", "", *ids, retry_after=wait)
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return Answer(400, "invalid", "the body is not a JSON object", "", *ids)
    decision = decide(name, trigger, verdict, payload, body)
    if not decision.accepted:
        row = TriggerDelivery(name, verdict.delivery_id, now, verdict.event_type, "ignored")
        if not await store.record_delivery(row):
            return Answer(200, "duplicate", "duplicate", "", *ids)
        return Answer(202, "ignored", f"ignored: {decision.why}", decision.why, *ids)
    runs = [(_run_id(), POST_KIND if trigger.deliver_only else TRIGGER_KIND, decision.text)]
    if decision.closes:
        runs.append((_run_id(), POST_KIND, f"Closed: {decision.thread_key}"))
    row = TriggerDelivery(
        name, verdict.delivery_id, now, verdict.event_type, "accepted", runs[0][0]
    )
    accepted = Acceptance(
        row,
        new_conv=f"{THREAD_CHANNEL}:{name}:{uuid.uuid4().hex[:16]}",
        place=trigger.channel,
        header=decision.header,
        runs=tuple(runs),
        thread_key=decision.thread_key,
        closes=decision.closes,
    )
    conv = await store.accept_delivery(accepted)
    if conv is None:
        return Answer(200, "duplicate", "duplicate", "", *ids)
    run_ids = tuple(r[0] for r in runs)
    return Answer(
        202,
        "accepted",
        "accepted",
        "",
        *ids,
        conv=conv,
        run_ids=run_ids,
        warnings=decision.warnings,
    )


def _run_id() -> str:
    from core.agent.turn import new_run_id  # the runs' own ids (core.agent is heavier)

    return new_run_id()


__all__ = ["Answer", "Decision", "decide", "receive", "thread_key"]
