"""`sign` is `verify`'s other half: what it signs, `verify` accepts, for every source."""

from __future__ import annotations

import pytest

from core.triggers.verify import SOURCES, Rejected, Source, Verified, sign, verify
from tests.triggers.test_verify import (
    GITHUB_BODY,
    GITHUB_SECRET,
    GITHUB_SIG,
    STD_BODY,
    STD_ID,
    STD_SECRET,
    STD_SIG,
    STD_TS,
)

BODY = b'{"type": "ping", "event": {"event_type": "incident.triggered"}}'
SECRET = {"standard": STD_SECRET}


def test_sign_reproduces_githubs_published_example() -> None:
    headers = sign("github", GITHUB_SECRET, GITHUB_BODY, 0, "d-1", event="push")
    assert headers["X-Hub-Signature-256"] == GITHUB_SIG


def test_sign_reproduces_the_standard_webhooks_vector() -> None:
    headers = sign("standard", STD_SECRET, STD_BODY, STD_TS, STD_ID)
    assert headers["webhook-signature"] == STD_SIG


@pytest.mark.parametrize("source", SOURCES)
def test_what_sign_signs_verify_accepts_with_its_id_and_event(source: Source) -> None:
    secret = SECRET.get(source, "s3cret")
    headers = sign(source, secret, BODY, 1_700_000_000, "delivery-7", event="ping")
    verdict = verify(source, [secret], headers, BODY, 1_700_000_000)
    expected = "incident.triggered" if source == "pagerduty" else "ping"
    assert verdict == Verified("delivery-7", expected)


@pytest.mark.parametrize("source", SOURCES)
def test_a_signature_with_another_secret_is_refused(source: Source) -> None:
    headers = sign(source, SECRET.get(source, "s3cret"), BODY, 1_700_000_000, "d", event="e")
    other = "whsec_" + "QUJD" * 8 if source == "standard" else "another"
    assert isinstance(verify(source, [other], headers, BODY, 1_700_000_000), Rejected)
