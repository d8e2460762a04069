"""Is this webhook from who it says? Each source's signature scheme, as a pure function.

`verify(source, secrets, headers, body, now)` checks one incoming delivery against the
trigger's secrets (several at once, so a secret can be rotated without downtime) and
answers `Verified` (with the delivery id the dedupe keys on and the event type the
`events` list filters on) or `Rejected` (with a reason for the log and the audit entry,
never for the client, who gets a bare 401). It reads no clock, no environment and no
network: the route that calls it owns those. What each source checks, and where each
vendor's scheme is documented, is in docs/triggers.md ("Verification").

Every compare is `hmac.compare_digest` over bytes (over `str` it raises on non-ASCII, which
a forged header could exploit to turn a 401 into a 500).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Literal

from core.records import record

Source = Literal["github", "gitlab", "sentry", "pagerduty", "standard", "token"]
SOURCES: tuple[Source, ...] = ("github", "gitlab", "sentry", "pagerduty", "standard", "token")

# Standard Webhooks and Sentry: how far a signed timestamp may be from our clock, either way.
REPLAY_WINDOW_SECONDS = 300
# A delivery id is stored and logged; a sender could put anything in the header.
MAX_DELIVERY_ID_CHARS = 200


@record(frozen=True, slots=True)
class Verified:
    """The delivery is authentic. `delivery_id` is the sender's id, or `sha256:<hex of body>`."""

    delivery_id: str
    event_type: str
    kind: Literal["verified"] = "verified"


@record(frozen=True, slots=True)
class Rejected:
    """The delivery is not authentic. `reason` is for logs and audit only, never the client."""

    reason: str
    kind: Literal["rejected"] = "rejected"


Verdict = Verified | Rejected
Headers = Mapping[str, str]
_Check = Callable[[list[str], dict[str, str], bytes, float], Verdict]


def verify(
    source: Source, secrets: list[str], headers: Headers, body: bytes, now: float
) -> Verdict:
    """Check one delivery's signature the way `source` documents it.

    Args:
        source: the trigger's `source`.
        secrets: every secret currently accepted; empty strings are ignored, never matched.
        headers: the request's headers, any case (looked up case-insensitively).
        body: the raw body, exactly as received.
        now: the current Unix time, for the replay window of timestamped schemes.
    """
    usable = [s for s in secrets if s]
    if not usable:
        return Rejected("no secret configured")
    lowered = {name.lower(): value for name, value in headers.items()}
    return _CHECKS[source](usable, lowered, body, now)


def sign(
    source: Source, secret: str, body: bytes, now: float, delivery_id: str, *, event: str = ""
) -> dict[str, str]:
    """The headers `source` would send with `body`, signed with `secret`: the other half of
    `verify`, for `parley triggers test` and the tests only (never on a live route).

    `event` goes in the source's event header where it has one (GitHub, GitLab, Sentry);
    PagerDuty, Standard Webhooks and token senders carry the event type in the body.
    """
    stamp = str(int(now))
    match source:
        case "github":
            signature = "sha256=" + _hex_hmac(secret, body).decode()
            return {
                "X-Hub-Signature-256": signature,
                "X-GitHub-Delivery": delivery_id,
                "X-GitHub-Event": event,
            }
        case "gitlab":
            return {
                "X-Gitlab-Token": secret,
                "Idempotency-Key": delivery_id,
                "X-Gitlab-Event": event,
            }
        case "sentry":
            return {
                "Sentry-Hook-Signature": _hex_hmac(secret, body).decode(),
                "Sentry-Hook-Timestamp": stamp,
                "Sentry-Hook-Resource": event,
                "Request-ID": delivery_id,
            }
        case "pagerduty":
            signature = "v1=" + _hex_hmac(secret, body).decode()
            return {"X-PagerDuty-Signature": signature, "X-Webhook-Id": delivery_id}
        case "standard":
            signed = f"{delivery_id}.{stamp}.".encode() + body
            digest = base64.b64encode(hmac.digest(_standard_key(secret), signed, "sha256"))
            return {
                "webhook-id": delivery_id,
                "webhook-timestamp": stamp,
                "webhook-signature": "v1," + digest.decode(),
            }
        case "token":
            return {"Authorization": f"Bearer {secret}", "Idempotency-Key": delivery_id}


def check_secret(source: Source, secret: str) -> str | None:
    """What is wrong with `secret` for `source`, or None: for the start-up check."""
    if not secret:
        return "is empty"
    if source == "standard":
        try:
            _standard_key(secret)
        except ValueError:
            return "is not a Standard Webhooks secret (whsec_ followed by base64)"
    return None


def _github(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    given = headers.get("x-hub-signature-256", "").strip().encode()
    if not given:
        return Rejected("X-Hub-Signature-256 missing")
    if not any(hmac.compare_digest(b"sha256=" + _hex_hmac(s, body), given) for s in secrets):
        return Rejected("X-Hub-Signature-256 does not match")
    return _verified(headers.get("x-github-delivery"), headers.get("x-github-event", ""), body)


def _gitlab(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    given = headers.get("x-gitlab-token", "").encode()
    if not given:
        return Rejected("X-Gitlab-Token missing")
    if not any(hmac.compare_digest(s.encode(), given) for s in secrets):
        return Rejected("X-Gitlab-Token does not match")
    # Idempotency-Key is the one GitLab keeps across retries (17.4 on); older instances
    # send only X-Gitlab-Event-UUID, which is per event and so also fine for dedupe.
    delivery = headers.get("idempotency-key") or headers.get("x-gitlab-event-uuid")
    return _verified(delivery, headers.get("x-gitlab-event", ""), body)


def _sentry(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    given = headers.get("sentry-hook-signature", "").strip().encode()
    if not given:
        return Rejected("Sentry-Hook-Signature missing")
    if not any(hmac.compare_digest(_hex_hmac(s, body), given) for s in secrets):
        return Rejected("Sentry-Hook-Signature does not match")
    # Sentry does not sign its timestamp, so the window only stops a replay that keeps
    # the captured header; the dedupe on Request-ID is the rest of the defence.
    stale = _outside_window(headers.get("sentry-hook-timestamp"), now, "Sentry-Hook-Timestamp")
    if stale is not None:
        return stale
    return _verified(headers.get("request-id"), headers.get("sentry-hook-resource", ""), body)


def _pagerduty(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    header = headers.get("x-pagerduty-signature", "")
    # v1 signatures only; PagerDuty sends one per active secret, comma-separated.
    given = [part.strip()[3:].encode() for part in header.split(",") if part.strip()[:3] == "v1="]
    if not given:
        return Rejected("X-PagerDuty-Signature missing or has no v1 signature")
    expected = [_hex_hmac(s, body) for s in secrets]
    if not any(hmac.compare_digest(e, g) for e in expected for g in given):
        return Rejected("X-PagerDuty-Signature does not match")
    event = _json_field(body, "event")
    event_type = event.get("event_type") if isinstance(event, dict) else None
    return _verified(headers.get("x-webhook-id"), _text(event_type), body)


def _standard(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    header = headers.get("webhook-signature", "")
    if not (msg_id and stamp and header):
        return Rejected("webhook-id, webhook-timestamp or webhook-signature missing")
    stale = _outside_window(stamp, now, "webhook-timestamp")
    if stale is not None:
        return stale
    signed = f"{msg_id}.{stamp}.".encode() + body
    given = [
        version_sig[3:].encode() for version_sig in header.split(" ") if version_sig[:3] == "v1,"
    ]
    keys = []
    for secret in secrets:
        try:
            keys.append(_standard_key(secret))
        except ValueError:
            continue  # refused at start-up by check_secret; never a match here
    expected = [base64.b64encode(hmac.digest(key, signed, "sha256")) for key in keys]
    if not any(hmac.compare_digest(e, g) for e in expected for g in given):
        return Rejected("webhook-signature does not match")
    return _verified(msg_id, _text(_json_field(body, "type")), body)


def _token(secrets: list[str], headers: dict[str, str], body: bytes, now: float) -> Verdict:
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Rejected("Authorization: Bearer missing")
    given = token.strip().encode()
    if not any(hmac.compare_digest(s.encode(), given) for s in secrets):
        return Rejected("bearer token does not match")
    return _verified(headers.get("idempotency-key"), _text(_json_field(body, "type")), body)


_CHECKS: dict[Source, _Check] = {
    "github": _github,
    "gitlab": _gitlab,
    "sentry": _sentry,
    "pagerduty": _pagerduty,
    "standard": _standard,
    "token": _token,
}


def _hex_hmac(secret: str, body: bytes) -> bytes:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()


def _standard_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (the spec's libraries make the prefix optional)."""
    encoded = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError("not base64") from exc
    if not key:
        raise ValueError("empty key")
    return key


def _outside_window(stamp: str | None, now: float, header: str) -> Rejected | None:
    if not stamp or not stamp.strip().isdigit():
        return Rejected(f"{header} missing or not Unix seconds")
    skew = now - int(stamp.strip())
    if abs(skew) > REPLAY_WINDOW_SECONDS:
        return Rejected(f"{header} {int(skew)} s from now, outside the replay window")
    return None


def _verified(delivery_id: str | None, event_type: str, body: bytes) -> Verdict:
    if not delivery_id:
        return Verified("sha256:" + hashlib.sha256(body).hexdigest(), event_type)
    if len(delivery_id) > MAX_DELIVERY_ID_CHARS or not delivery_id.isprintable():
        return Rejected("delivery id too long or not printable")
    return Verified(delivery_id, event_type)


def _json_field(body: bytes, name: str) -> object:
    """A top-level field of a JSON object body, or None; only read once the body is verified."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return document.get(name) if isinstance(document, dict) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
