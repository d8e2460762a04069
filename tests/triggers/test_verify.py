"""Webhook verification: each source against its vendor's published vector, then the ways a
delivery is refused (bad, missing, expired, rotated) and the body-size rule.

Where a vendor publishes no vector, the constant below was computed once with
`openssl dgst -sha256 -hmac SECRET` from the documented scheme, so the test does not
re-derive it with the code under test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator

import pytest

from core.triggers.body import length_verdict, read_capped
from core.triggers.verify import (
    REPLAY_WINDOW_SECONDS,
    Rejected,
    Verified,
    check_secret,
    verify,
)

# GitHub's own example, docs.github.com "Validating webhook deliveries" (Testing the
# webhook payload validation).
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_BODY = b"Hello, World!"
GITHUB_SIG = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# Standard Webhooks' vector, from the spec's Python library
# (libraries/python/tests/test_webhooks.py, test_sign_function).
STD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
STD_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
STD_TS = 1614265330
STD_BODY = b'{"test": 2432232314}'
STD_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# PagerDuty's "Verifying Signatures" page shows a header with two signatures but not the
# secret or body behind them, so it is no vector: built from the documented scheme (hex
# HMAC-SHA256 of the body, `v1=` each, comma-separated, one per active secret).
PD_BODY = (
    b'{"event":{"id":"01DEN1HNLBC1VITBAF5LS0SDBM","event_type":"incident.triggered",'
    b'"resource_type":"incident"}}'
)
PD_SIG_ONE = "v1=6e449601d233fe66a9a76b0ede27e6d22cadf0c5791b27acd86fd657241b80ce"
PD_SIG_TWO = "v1=3e507b47e855fb1143d395b9663a6e044ee9529a527e72843d2ea436faf43df3"

# Sentry documents the scheme (hex HMAC-SHA256 of the body with the Client Secret) and no
# vector; the body has the shape of its issue webhook.
SENTRY_SECRET = "sentry-client-secret"
SENTRY_BODY = (
    b'{"action": "created", "installation": {"uuid": "7a485448-a9e2-4c85-8a3c-4f44175783c9"},'
    b' "data": {"issue": {"id": "1170820242"}}, "actor": {"type": "application",'
    b' "id": "sentry", "name": "Sentry"}}'
)
SENTRY_SIG = "0aa366c01c7a82e8c96f22e3a43b692f19ae69f8bec043a814c512bc57c14682"
SENTRY_TS = 1_700_000_000


def rejected(verdict: Verified | Rejected) -> str:
    assert isinstance(verdict, Rejected), verdict
    return verdict.reason


# -- GitHub -----------------------------------------------------------------------------


def test_github_accepts_githubs_published_example() -> None:
    headers = {
        "X-Hub-Signature-256": GITHUB_SIG,
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": "check_run",
    }
    verdict = verify("github", [GITHUB_SECRET], headers, GITHUB_BODY, now=0)
    assert verdict == Verified("72d3162e-cc78-11e3-81ab-4c9367dc0958", "check_run")


def test_github_headers_are_found_in_any_case() -> None:
    headers = {"x-hub-signature-256": GITHUB_SIG, "X-GITHUB-EVENT": "ping"}
    verdict = verify("github", [GITHUB_SECRET], headers, GITHUB_BODY, now=0)
    assert isinstance(verdict, Verified)
    assert verdict.event_type == "ping"


def test_github_refuses_a_changed_body_a_wrong_secret_and_a_missing_header() -> None:
    good = {"X-Hub-Signature-256": GITHUB_SIG}
    assert "match" in rejected(verify("github", [GITHUB_SECRET], good, b"Hello, World?", now=0))
    assert "match" in rejected(verify("github", ["other"], good, GITHUB_BODY, now=0))
    assert "missing" in rejected(verify("github", [GITHUB_SECRET], {}, GITHUB_BODY, now=0))


def test_github_refuses_the_legacy_sha1_header_alone() -> None:
    sha1 = "sha1=" + hmac.new(GITHUB_SECRET.encode(), GITHUB_BODY, "sha1").hexdigest()
    headers = {"X-Hub-Signature": sha1}
    assert "missing" in rejected(verify("github", [GITHUB_SECRET], headers, GITHUB_BODY, now=0))


def test_a_rotated_secret_is_accepted_while_both_are_listed() -> None:
    headers = {"X-Hub-Signature-256": GITHUB_SIG}
    both = ["the-new-secret", GITHUB_SECRET]
    assert isinstance(verify("github", both, headers, GITHUB_BODY, now=0), Verified)
    assert isinstance(verify("github", ["the-new-secret"], headers, GITHUB_BODY, now=0), Rejected)


def test_no_usable_secret_refuses_everything() -> None:
    headers = {"X-Gitlab-Token": ""}
    assert "no secret" in rejected(verify("gitlab", [], headers, b"{}", now=0))
    assert "no secret" in rejected(verify("gitlab", [""], headers, b"{}", now=0))


def test_a_missing_delivery_id_becomes_the_bodys_sha256() -> None:
    verdict = verify("github", [GITHUB_SECRET], {"X-Hub-Signature-256": GITHUB_SIG}, GITHUB_BODY, 0)
    assert isinstance(verdict, Verified)
    assert verdict.delivery_id == "sha256:" + hashlib.sha256(GITHUB_BODY).hexdigest()


def test_an_oversized_or_unprintable_delivery_id_is_refused() -> None:
    for bad in ("x" * 201, "id\nforged-log-line"):
        headers = {"X-Hub-Signature-256": GITHUB_SIG, "X-GitHub-Delivery": bad}
        assert "delivery id" in rejected(verify("github", [GITHUB_SECRET], headers, GITHUB_BODY, 0))


def test_a_non_ascii_signature_is_a_refusal_not_a_crash() -> None:
    headers = {"X-Hub-Signature-256": "sha256=é"}
    assert "match" in rejected(verify("github", [GITHUB_SECRET], headers, GITHUB_BODY, now=0))


# -- GitLab -----------------------------------------------------------------------------
# GitLab sends the secret token itself (no HMAC), so there is no vector to publish.


def test_gitlab_accepts_its_token_and_prefers_the_idempotency_key() -> None:
    headers = {
        "X-Gitlab-Token": "gl-token",
        "X-Gitlab-Event": "Pipeline Hook",
        "X-Gitlab-Event-UUID": "13792a34-cac6-4fda-95a8-c58e00a3954e",
        "Idempotency-Key": "f5e5f430-f57b-4e6e-9fac-d9128cd7232f",
    }
    verdict = verify("gitlab", ["gl-token"], headers, b"{}", now=0)
    assert verdict == Verified("f5e5f430-f57b-4e6e-9fac-d9128cd7232f", "Pipeline Hook")
    del headers["Idempotency-Key"]
    verdict = verify("gitlab", ["gl-token"], headers, b"{}", now=0)
    assert verdict == Verified("13792a34-cac6-4fda-95a8-c58e00a3954e", "Pipeline Hook")


def test_gitlab_refuses_a_wrong_or_missing_token() -> None:
    assert "match" in rejected(
        verify("gitlab", ["gl-token"], {"X-Gitlab-Token": "gl-tokeN"}, b"", 0)
    )
    assert "missing" in rejected(verify("gitlab", ["gl-token"], {}, b"", 0))


# -- Sentry -----------------------------------------------------------------------------


def sentry_headers(signature: str = SENTRY_SIG, stamp: int = SENTRY_TS) -> dict[str, str]:
    return {
        "Request-ID": "6f1c1b4cc1e04ebba7a0f1cb3d3a3a44",
        "Sentry-Hook-Resource": "issue",
        "Sentry-Hook-Timestamp": str(stamp),
        "Sentry-Hook-Signature": signature,
    }


def test_sentry_accepts_a_signature_made_by_the_documented_scheme() -> None:
    verdict = verify("sentry", [SENTRY_SECRET], sentry_headers(), SENTRY_BODY, now=SENTRY_TS + 3)
    assert verdict == Verified("6f1c1b4cc1e04ebba7a0f1cb3d3a3a44", "issue")


def test_sentry_refuses_outside_the_five_minute_window_either_way() -> None:
    late = SENTRY_TS + REPLAY_WINDOW_SECONDS + 1
    early = SENTRY_TS - REPLAY_WINDOW_SECONDS - 1
    for now in (late, early):
        reason = rejected(verify("sentry", [SENTRY_SECRET], sentry_headers(), SENTRY_BODY, now))
        assert "replay window" in reason
    edge = SENTRY_TS + REPLAY_WINDOW_SECONDS
    assert isinstance(
        verify("sentry", [SENTRY_SECRET], sentry_headers(), SENTRY_BODY, edge), Verified
    )


def test_sentry_refuses_a_bad_signature_and_a_missing_timestamp() -> None:
    bad = sentry_headers(signature="0" * 64)
    assert "match" in rejected(verify("sentry", [SENTRY_SECRET], bad, SENTRY_BODY, SENTRY_TS))
    no_stamp = sentry_headers()
    del no_stamp["Sentry-Hook-Timestamp"]
    assert "Unix seconds" in rejected(
        verify("sentry", [SENTRY_SECRET], no_stamp, SENTRY_BODY, SENTRY_TS)
    )


# -- PagerDuty --------------------------------------------------------------------------


def test_pagerduty_accepts_any_one_of_several_v1_signatures() -> None:
    headers = {
        "X-PagerDuty-Signature": f"{PD_SIG_TWO},{PD_SIG_ONE}",
        "X-Webhook-Id": "7b9b4ffc-0b1f-4ba2-a1d6-2b6d0c3ea7a0",
    }
    verdict = verify("pagerduty", ["pd-secret-one"], headers, PD_BODY, now=0)
    assert verdict == Verified("7b9b4ffc-0b1f-4ba2-a1d6-2b6d0c3ea7a0", "incident.triggered")


def test_pagerduty_refuses_unknown_versions_and_wrong_signatures() -> None:
    other_version = {"X-PagerDuty-Signature": PD_SIG_ONE.replace("v1=", "v2=")}
    assert "no v1" in rejected(verify("pagerduty", ["pd-secret-one"], other_version, PD_BODY, 0))
    only_two = {"X-PagerDuty-Signature": PD_SIG_TWO}
    assert "match" in rejected(verify("pagerduty", ["pd-secret-one"], only_two, PD_BODY, 0))
    assert isinstance(verify("pagerduty", ["pd-secret-two"], only_two, PD_BODY, 0), Verified)


# -- Standard Webhooks ------------------------------------------------------------------


def std_headers(signature: str = STD_SIG, msg_id: str = STD_ID) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(STD_TS), "webhook-signature": signature}


def test_standard_accepts_the_specs_published_vector() -> None:
    verdict = verify("standard", [STD_SECRET], std_headers(), STD_BODY, now=STD_TS)
    assert verdict == Verified(STD_ID, "")


def test_standard_reads_the_event_type_from_the_bodys_type() -> None:
    body = b'{"type":"invoice.paid","data":{}}'
    signed = f"{STD_ID}.{STD_TS}.".encode() + body
    key = base64.b64decode(STD_SECRET.removeprefix("whsec_"))
    sig = "v1," + base64.b64encode(hmac.digest(key, signed, "sha256")).decode()
    verdict = verify("standard", [STD_SECRET], std_headers(sig), body, now=STD_TS)
    assert verdict == Verified(STD_ID, "invoice.paid")


def test_standard_finds_the_valid_one_among_several_signatures() -> None:
    noise = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
    header = f"{noise} v1a,{noise[3:]} {STD_SIG} {noise}"
    assert isinstance(
        verify("standard", [STD_SECRET], std_headers(header), STD_BODY, STD_TS), Verified
    )


def test_standard_signature_covers_the_id_and_the_timestamp() -> None:
    other_id = std_headers(msg_id="msg_other")
    assert "match" in rejected(verify("standard", [STD_SECRET], other_id, STD_BODY, STD_TS))
    moved = std_headers() | {"webhook-timestamp": str(STD_TS + 1)}
    assert "match" in rejected(verify("standard", [STD_SECRET], moved, STD_BODY, STD_TS))


def test_standard_refuses_expired_missing_and_forged_deliveries() -> None:
    expired = STD_TS + REPLAY_WINDOW_SECONDS + 1
    assert "replay window" in rejected(
        verify("standard", [STD_SECRET], std_headers(), STD_BODY, expired)
    )
    for header in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        partial = std_headers()
        del partial[header]
        assert "missing" in rejected(verify("standard", [STD_SECRET], partial, STD_BODY, STD_TS))
    tampered = STD_BODY.replace(b"2432232314", b"2432232315")
    assert "match" in rejected(verify("standard", [STD_SECRET], std_headers(), tampered, STD_TS))


def test_standard_secret_without_prefix_works_and_a_broken_one_is_named() -> None:
    bare = STD_SECRET.removeprefix("whsec_")
    assert isinstance(verify("standard", [bare], std_headers(), STD_BODY, STD_TS), Verified)
    assert check_secret("standard", STD_SECRET) is None
    assert check_secret("standard", "whsec_not base64!") is not None
    assert check_secret("github", "") == "is empty"
    rotated = ["whsec_not base64!", STD_SECRET]
    assert isinstance(verify("standard", rotated, std_headers(), STD_BODY, STD_TS), Verified)


# -- Bearer token -----------------------------------------------------------------------


def test_token_accepts_a_bearer_in_any_case_and_refuses_others() -> None:
    body = b'{"type":"deploy.finished"}'
    ok = verify("token", ["tok"], {"Authorization": "bearer tok"}, body, now=0)
    assert ok == Verified("sha256:" + hashlib.sha256(body).hexdigest(), "deploy.finished")
    keyed = verify(
        "token", ["tok"], {"Authorization": "Bearer tok", "Idempotency-Key": "k1"}, body, 0
    )
    assert keyed == Verified("k1", "deploy.finished")
    assert "match" in rejected(verify("token", ["tok"], {"Authorization": "Bearer to"}, body, 0))
    assert "missing" in rejected(verify("token", ["tok"], {"Authorization": "Basic tok"}, body, 0))
    assert "missing" in rejected(verify("token", ["tok"], {}, body, 0))


# -- Body size --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "verdict"),
    [
        (None, "read"),
        ("0", "read"),
        ("1024", "read"),
        ("1025", "too_large"),
        ("99999999999999999999", "too_large"),
        ("-1", "invalid"),
        ("+5", "invalid"),
        ("1_000", "invalid"),
        ("", "invalid"),
        ("12abc", "invalid"),
        ("١٢", "invalid"),  # Arabic-Indic digits pass str.isdigit()
    ],
)
def test_content_length_decides_before_reading(header: str | None, verdict: str) -> None:
    assert length_verdict(header, max_body_bytes=1024) == verdict


class Stream:
    """An async byte stream that counts how many chunks were taken from it."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.taken = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


async def test_a_body_within_the_limit_is_read_whole() -> None:
    stream = Stream([b"ab", b"cd", b"e"])
    assert await read_capped(stream, max_body_bytes=5) == b"abcde"
    assert stream.taken == 3


async def test_a_body_over_the_limit_stops_the_read_at_the_chunk_that_passes_it() -> None:
    stream = Stream([b"x" * 400] * 100)
    assert await read_capped(stream, max_body_bytes=1000) is None
    assert stream.taken == 3  # 1200 bytes read of 40000: never read to its end
