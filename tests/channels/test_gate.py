"""Who the bot answers (channels/gate.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from channels.gate import AccessConfig, Gate
from core.chat import Inbound
from tests.fakes.clock import FakeClock


def msg(
    user: str = "U1",
    channel: str = "C1",
    *,
    dm: bool = False,
    mention: bool = False,
    text: str = "hello there",
) -> Inbound:
    return Inbound(
        channel="test",
        channel_id=channel,
        thread_id="",
        user_id=user,
        user_name=user.lower(),
        text=text,
        is_dm=dm,
        mentions_bot=mention,
        event_id=f"ev-{user}-{channel}",
    )


def gate(**config: Any) -> Gate:
    return Gate(AccessConfig(**config), clock=FakeClock())


def test_own_messages_are_never_admitted() -> None:
    g = gate(open=True, ignore_bots=False)
    assert not g.admit(msg(dm=True), from_bot=True, from_self=True)
    assert not g.admit(msg(dm=True), from_bot=False, from_self=True)


def test_other_bots_are_ignored_by_default() -> None:
    g = gate(open=True)
    assert not g.admit(msg(dm=True), from_bot=True, from_self=False)
    assert g.admit(msg(dm=True), from_bot=False, from_self=False)


def test_a_bot_that_mentions_parley_is_answered_if_allowed() -> None:
    g = gate(allow_channels=["C1"])
    assert g.admit(msg("ALERTBOT", mention=True), from_bot=True, from_self=False)
    assert not g.admit(msg("ALERTBOT", "C9", mention=True), from_bot=True, from_self=False)


def test_a_slow_bot_loop_stops_at_the_chain_cap_until_a_human_speaks() -> None:
    clock = FakeClock()
    g = Gate(AccessConfig(open=True, max_bot_chain=6), clock=clock)
    answered = []
    for _minute in range(4):  # 3 messages, a minute's pause, 3 more …: the budget refills
        for _ in range(3):
            answered.append(g.admit(msg("B1", mention=True), from_bot=True, from_self=False))
        clock.now += 61
    # Each answered bot message and Parley's answer make two messages with no human.
    assert answered == [True, True, True] + [False] * 9
    assert g.admit(msg("U1", mention=True), from_bot=False, from_self=False)
    assert g.admit(msg("B1", mention=True), from_bot=True, from_self=False)
    other_place = msg("B1", "C2", mention=True)
    assert g.admit(other_place, from_bot=True, from_self=False)


def test_empty_allowlists_admit_nobody_and_open_admits_everyone() -> None:
    closed = gate()
    assert not closed.admit(msg(dm=True), from_bot=False, from_self=False)
    assert not closed.admit(msg(mention=True), from_bot=False, from_self=False)
    opened = gate(open=True)
    assert opened.admit(msg("anyone", dm=True), from_bot=False, from_self=False)
    assert opened.admit(msg("anyone", "Cx", mention=True), from_bot=False, from_self=False)


def test_allowlisted_user_or_channel() -> None:
    g = gate(allow_users=["U1"], allow_channels=["C9"])
    assert g.admit(msg("U1", "D1", dm=True), from_bot=False, from_self=False)
    assert not g.admit(msg("U2", "D2", dm=True), from_bot=False, from_self=False)
    assert g.admit(msg("U2", "C9", mention=True), from_bot=False, from_self=False)
    assert not g.admit(msg("U2", "C8", mention=True), from_bot=False, from_self=False)


def test_groups_need_a_mention_or_the_bots_thread_unless_configured() -> None:
    g = gate(allow_users=["U1"])
    assert not g.admit(msg(), from_bot=False, from_self=False)
    assert g.admit(msg(mention=True), from_bot=False, from_self=False)
    assert g.admit(msg(), from_bot=False, from_self=False, in_bot_thread=True)
    assert g.admit(msg(dm=True), from_bot=False, from_self=False)  # DMs always
    relaxed = gate(allow_users=["U1"], require_mention=False)
    assert relaxed.admit(msg(), from_bot=False, from_self=False)


def test_allowed_bot_has_a_per_peer_budget_per_minute() -> None:
    clock = FakeClock()
    chain = {"max_bot_chain": 100}  # the chain cap is tested on its own
    g = Gate(AccessConfig(open=True, ignore_bots=False, bot_peer_budget=3, **chain), clock=clock)
    results = [g.admit(msg("B1", dm=True), from_bot=True, from_self=False) for _ in range(5)]
    assert results == [True, True, True, False, False]
    assert g.admit(msg("B2", dm=True), from_bot=True, from_self=False)  # another peer
    assert g.admit(msg("U1", dm=True), from_bot=False, from_self=False)  # humans unaffected
    clock.now += 30
    assert not g.admit(msg("B1", dm=True), from_bot=True, from_self=False)
    clock.now += 31
    assert g.admit(msg("B1", dm=True), from_bot=True, from_self=False)
    # Messages refused for other reasons do not use up the budget.
    g2 = Gate(AccessConfig(open=True, ignore_bots=False, bot_peer_budget=1, **chain), clock=clock)
    assert not g2.admit(msg("B1"), from_bot=True, from_self=False)  # no mention
    assert g2.admit(msg("B1", mention=True), from_bot=True, from_self=False)
    none = Gate(AccessConfig(open=True, ignore_bots=False, bot_peer_budget=0), clock=clock)
    assert not none.admit(msg("B1", dm=True), from_bot=True, from_self=False)


def test_refusals_are_logged_with_reason_but_not_text(caplog: pytest.LogCaptureFixture) -> None:
    g = gate(allow_users=["U1"])
    with caplog.at_level(logging.DEBUG, logger="channels.gate"):
        assert not g.admit(msg("U2", dm=True, text="secret words"), from_bot=False, from_self=False)
        assert not g.admit(msg(text="secret words"), from_bot=False, from_self=False)
    assert len(caplog.records) == 2
    assert "allowlist" in caplog.records[0].getMessage()
    assert "mention" in caplog.records[1].getMessage()
    assert "secret" not in caplog.text
