"""`parley triggers list` and `parley triggers test NAME --payload FILE`: operate triggers.

`test` tries a trigger without a sender: it signs the payload locally with the trigger's
current secret the way its source signs, verifies it as the route will, and shows each
decision the route would take; with `--post` it then sends the signed delivery to the
running Parley, as the sender would (docs/triggers.md#trying-a-trigger).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.config import ParleyConfig
from core.errors import ConfigError
from core.triggers.config import TriggerConfig, check_trigger_secrets
from core.triggers.receive import thread_key
from core.triggers.template import external_block
from core.triggers.verify import Verified, sign, verify

# What `test` shows of the external data block: enough to see the fence and the data.
BLOCK_LINES = 12
BLOCK_CAP = 16_000
# Sources whose event type travels in a header that `--event` fills (the rest: the body).
_EVENT_HEADER = {"github", "gitlab", "sentry"}


async def triggers_list(config: ParleyConfig, environ: Mapping[str, str]) -> int:
    """Name, source, channel and last delivery of each configured trigger."""
    if not config.triggers:
        sys.stdout.write("No triggers configured ([triggers.NAME] in config.toml).\n")
        return 0
    from bot.wiring import open_existing_store

    last: dict[str, Any] = {}
    store = await open_existing_store(config.store, environ)
    if store is not None:
        try:
            last = dict(await store.last_deliveries())
        finally:
            await store.aclose()
    rows = [("TRIGGER", "SOURCE", "CHANNEL", "LAST DELIVERY", "OUTCOME")]
    for name, trigger in sorted(config.triggers.items()):
        seen = last.get(name)
        when = (
            dt.datetime.fromtimestamp(seen.received_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            if seen is not None
            else "none"
        )
        rows.append((name, trigger.source, trigger.channel, when, seen.outcome if seen else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        sys.stdout.write(line.rstrip() + "\n")
    return 0


async def triggers_test(
    config: ParleyConfig,
    environ: Mapping[str, str],
    name: str,
    payload_path: Path,
    event: str | None,
    *,
    post: bool = False,
) -> int:
    """Sign, verify and render one payload for trigger `name`; with `post`, also send the
    signed delivery to the running Parley's route (`[server] listen`), else post nothing.

    Raises:
        ConfigError: the trigger's secret variable is unset or unusable.
    """
    trigger = config.triggers.get(name)
    if trigger is None:
        known = ", ".join(sorted(config.triggers)) or "none"
        sys.stderr.write(f"parley: no trigger named `{name}` (configured: {known})\n")
        return 1
    check_trigger_secrets({name: trigger}, environ)
    try:
        body = payload_path.read_bytes()  # noqa: ASYNC240 - a small file, once, in a CLI
        payload = json.loads(body)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"parley: cannot read {payload_path} as JSON: {exc}\n")
        return 1
    if not isinstance(payload, dict):
        sys.stderr.write(f"parley: {payload_path} is not a JSON object\n")
        return 1
    event_type = event or (trigger.events[0] if trigger.events else "")
    now = time.time()
    secret = trigger.secrets(environ)[0]
    headers = sign(trigger.source, secret, body, now, f"test-{uuid.uuid4()}", event=event_type)
    verdict = verify(trigger.source, trigger.secrets(environ), headers, body, now)
    if not isinstance(verdict, Verified):  # would be a bug in sign or verify
        sys.stderr.write(f"parley: the locally signed payload did not verify: {verdict.reason}\n")
        return 1
    _report(trigger, payload, verdict, event, body, posting=post)
    return await _send(config, name, body, headers) if post else 0


async def _send(config: ParleyConfig, name: str, body: bytes, headers: dict[str, str]) -> int:
    """POST the signed delivery to `/hooks/NAME` on `[server] listen` (a wildcard address
    is reached on the loopback); 0 if the route accepted it."""
    import httpx

    assert config.server.listen is not None
    host, port = config.server.address()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/hooks/{name}"
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            answer = await client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        sys.stderr.write(f"parley: could not post to {url}: {exc} (is `parley run` running?)\n")
        return 1
    sys.stdout.write(f"posted to {url}: {answer.status_code} {answer.text}\n")
    return 0 if answer.status_code in (200, 202) else 1


def _report(
    trigger: TriggerConfig,
    payload: dict[str, Any],
    verdict: Verified,
    event: str | None,
    body: bytes,
    *,
    posting: bool,
) -> None:
    out = sys.stdout.write
    out(f"signed as {trigger.source} and verified: delivery {verdict.delivery_id}\n")
    out(f"event type: {verdict.event_type or '(none)'}")
    if event and trigger.source not in _EVENT_HEADER:
        out(f" (from the body: {trigger.source} sends no event header, --event is unused)")
    out("\n")
    if not trigger.events:
        out("events: every event is accepted (no `events` list)\n")
    elif verdict.event_type in trigger.events:
        out(f"events: `{verdict.event_type}` is accepted\n")
    else:
        listed = ", ".join(trigger.events)
        out(f"events: `{verdict.event_type}` is not in [{listed}]: answered 202 ignored\n")
    condition = trigger.expr("filter")
    if condition is None:
        out("filter: none, every delivery passes\n")
    elif condition.matches(payload):
        out(f"filter: passes ({condition.text})\n")
    else:
        out(f"filter: rejects this payload, it would be ignored ({condition.text})\n")
    warnings: list[str] = []
    if trigger.thread_by is None:
        out("thread key: none (every delivery its own thread)\n")
    else:
        key = thread_key(trigger, payload, warnings)
        out(f"thread key: {key if key is not None else 'none (a thread of its own)'}\n")
    closing = trigger.expr("close_on")
    if closing is not None:
        out(f"close_on: {'closes' if closing.matches(payload) else 'does not close'} the thread\n")
    key = "message" if trigger.deliver_only else "prompt"
    text = trigger.template(key)
    assert text is not None  # the model requires it
    rendered = text.render(payload, quote=not trigger.deliver_only)
    warnings.extend(rendered.warnings)
    out(f"{key}:\n{rendered.text}\n")
    for warning in warnings:
        out(f"warning: {warning}\n")
    if not trigger.deliver_only:
        block = external_block(body.decode("utf-8", "replace"), trigger.source, BLOCK_CAP)
        lines = block.splitlines()
        out(f"external data block (first {min(BLOCK_LINES, len(lines))} of {len(lines)} lines):\n")
        out("\n".join(lines[:BLOCK_LINES]) + "\n")
    if not posting:
        out("posted nothing (a test; --post sends it to the running Parley)\n")


async def triggers_command(config: ParleyConfig, environ: Mapping[str, str], args: Any) -> int:
    """The `parley triggers` sub-command's actions."""
    if args.action == "list":
        return await triggers_list(config, environ)
    if not args.name or args.payload is None:
        sys.stderr.write("parley: `triggers test` needs NAME and --payload FILE\n")
        return 2
    if args.post and not config.server.listen:
        sys.stderr.write(
            "parley: --post sends the delivery to the running Parley's [server] listen, "
            "which is not set in the configuration\n"
        )
        return 2
    try:
        return await triggers_test(
            config, environ, args.name, args.payload, args.event, post=args.post
        )
    except ConfigError as exc:
        if config.source is not None:
            exc.in_file(config.source)
        sys.stderr.write(f"parley: configuration problem\n{exc}\n")
        return 2


__all__ = ["triggers_command", "triggers_list", "triggers_test"]
