"""Approval prompts: who decides, timeouts, settling the prompt (channels/approvals.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from channels.approvals import (
    CANCELLED,
    TIMED_OUT,
    Approvals,
    approval_button_id,
    parse_approval_button,
)
from core.chat import ApprovalRequest, PromptRef
from tests.fakes.clock import FakeClock


def make_request(request_id: str = "a1b2c3d4e5f6", timeout: float = 300.0) -> ApprovalRequest:
    return ApprovalRequest(request_id, "bash", "rm -rf ./junk", "destructive command", timeout)


class Prompt:
    """Stands in for the adapter's prompt message: records show() and settle()."""

    def __init__(self) -> None:
        self.shown: list[ApprovalRequest] = []
        self.settled: list[tuple[str, str]] = []

    async def show(self, request: ApprovalRequest) -> object:
        self.shown.append(request)
        return "message-1"

    async def settle(self, request: ApprovalRequest, text: str) -> None:
        self.settled.append((request.id, text))


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0)


async def test_approver_approves_and_others_cannot() -> None:
    approvals = Approvals(["U1"])
    prompt = Prompt()
    request = make_request()
    asking = asyncio.create_task(approvals.request(request, prompt.show, prompt.settle))
    await until(lambda: bool(prompt.shown))
    assert approvals.is_pending(request.id)
    assert approvals.resolve(request.id, "U2", "Mallory", True) == "not_approver"
    assert approvals.resolve("someotherid", "U1", "Ann", True) == "unknown"
    assert not asking.done()
    assert approvals.resolve(request.id, "U1", "Ann", True) == "ok"
    assert await asking is True
    assert prompt.settled == [(request.id, "✅ Approved by Ann")]
    assert approvals.resolve(request.id, "U1", "Ann", False) == "unknown"  # double click
    assert not approvals.is_pending(request.id)


async def test_approver_denies() -> None:
    approvals = Approvals({"U1", "U7"})
    prompt = Prompt()
    request = make_request()
    asking = asyncio.create_task(approvals.request(request, prompt.show, prompt.settle))
    await until(lambda: bool(prompt.shown))
    assert approvals.resolve(request.id, "U7", "Bob", False) == "ok"
    assert await asking is False
    assert prompt.settled == [(request.id, "❌ Denied by Bob")]


async def test_timeout_denies_and_settles_the_prompt() -> None:
    clock = FakeClock()
    approvals = Approvals(["U1"], clock=clock)
    prompt = Prompt()
    request = make_request(timeout=120.0)
    assert await approvals.request(request, prompt.show, prompt.settle) is False
    assert clock.sleeps == [120.0]
    assert prompt.settled == [(request.id, TIMED_OUT)]
    assert TIMED_OUT == "⌛ Timed out — denied"
    assert approvals.resolve(request.id, "U1", "Ann", True) == "unknown"


async def test_cancelled_request_settles_and_propagates() -> None:
    approvals = Approvals(["U1"])
    prompt = Prompt()
    request = make_request()
    asking = asyncio.create_task(approvals.request(request, prompt.show, prompt.settle))
    await until(lambda: bool(prompt.shown))
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert prompt.settled == [(request.id, CANCELLED)]
    assert approvals.resolve(request.id, "U1", "Ann", True) == "unknown"


async def test_nobody_is_an_approver_by_default() -> None:
    clock = FakeClock()
    approvals = Approvals([], clock=clock)
    prompt = Prompt()
    request = make_request(timeout=1.0)
    asking = asyncio.create_task(approvals.request(request, prompt.show, prompt.settle))
    await until(lambda: bool(prompt.shown))
    assert approvals.resolve(request.id, "U1", "Ann", True) in ("not_approver", "unknown")
    assert await asking is False


def test_button_data_round_trip() -> None:
    yes, no = approval_button_id("a1b2c3d4e5f6", True), approval_button_id("a1b2c3d4e5f6", False)
    assert yes != no
    assert parse_approval_button(yes) == ("a1b2c3d4e5f6", True, None)
    assert parse_approval_button(no) == ("a1b2c3d4e5f6", False, None)
    here = approval_button_id("a1b2c3d4e5f6", True, "conversation")
    channel = approval_button_id("a1b2c3d4e5f6", True, "channel")
    assert parse_approval_button(here) == ("a1b2c3d4e5f6", True, "conversation")
    assert parse_approval_button(channel) == ("a1b2c3d4e5f6", True, "channel")
    assert len(approval_button_id("x" * 48, True, "conversation").encode()) <= 64
    longest = approval_button_id("x" * 48, True)
    assert len(longest.encode()) <= 64
    assert Approvals.button_id("id1", True) == approval_button_id("id1", True)
    for junk in ("", "apv:", "apv:id:maybe", "other:id:y", "apv:a:b:y", yes + "x"):
        assert parse_approval_button(junk) is None
    with pytest.raises(ValueError, match="request id"):
        approval_button_id("x" * 49, True)
    with pytest.raises(ValueError, match="request id"):
        approval_button_id("has:colon", True)


async def test_an_approval_stands_when_the_prompt_cannot_be_edited() -> None:
    approvals = Approvals(["U1"])
    prompt = Prompt()

    async def broken_settle(request: ApprovalRequest, text: str) -> None:
        raise RuntimeError("the prompt message was deleted")

    request = make_request()
    asking = asyncio.create_task(approvals.request(request, prompt.show, broken_settle))
    await until(lambda: bool(prompt.shown))
    assert approvals.resolve(request.id, "U1", "Ann", True) == "ok"
    assert await asking is True


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.3, "1 s"), (8, "8 s"), (90, "90 s"), (300, "5 min"), (5400, "90 min"), (7200, "2 h")],
)
def test_timeouts_read_in_units_people_use(seconds: float, text: str) -> None:
    from channels.approvals import duration_text

    assert duration_text(seconds) == text


# ---- requests that outlive a restart (the agent stores them) --------------------------------


class Record:
    """The agent's record of a request: where its prompt is; whether Parley is restarting."""

    def __init__(self, *, restarting: bool = False) -> None:
        self.prompts: list[PromptRef] = []
        self.restarting = restarting

    def posted(self, prompt: PromptRef) -> None:
        self.prompts.append(prompt)

    def answered(self, allowed: bool, by: str) -> None:
        pass

    def outlives_cancellation(self) -> bool:
        return self.restarting


class StoreAgent:
    """The part of the agent a click on an unknown request reaches (`answer_approval`)."""

    def __init__(self, stored: ApprovalRequest | None) -> None:
        self.stored = stored
        self.answers: list[tuple[str, bool, str]] = []
        self.refused: list[tuple[str, str, str]] = []

    async def submit(self, inbound: object, responder: object) -> bool:
        raise AssertionError("not used")

    async def answer_approval(
        self, request_id: str, allow: bool, user_name: str
    ) -> ApprovalRequest | None:
        self.answers.append((request_id, allow, user_name))
        return self.stored

    async def approval_refused(
        self, request_id: str, channel: str, user_id: str, user_name: str, groups: Sequence[str]
    ) -> None:
        self.refused.append((request_id, channel, user_id))


class SettledPrompts:
    def __init__(self) -> None:
        self.settled: list[tuple[PromptRef | None, str]] = []

    async def __call__(self, request: ApprovalRequest, text: str) -> None:
        self.settled.append((request.prompt, text))


async def test_the_posted_prompt_is_recorded_and_settled() -> None:
    approvals = Approvals(["U1"])
    record, settled = Record(), SettledPrompts()
    where = PromptRef("chat-1", "m7", "Approve?")

    async def show(request: ApprovalRequest) -> PromptRef:
        return where

    request = replace(make_request(), record=record)
    asking = asyncio.create_task(approvals.request(request, show, settled))
    await until(lambda: bool(record.prompts))
    assert record.prompts == [where]
    assert approvals.resolve(request.id, "U1", "Ann", True) == "ok"
    assert await asking is True
    assert settled.settled == [(where, "✅ Approved by Ann")]


async def test_a_request_taken_up_after_a_restart_settles_its_old_prompt() -> None:
    clock = FakeClock()
    approvals = Approvals(["U1"], clock=clock)
    prompt, settled = Prompt(), SettledPrompts()
    old = PromptRef("chat-1", "m3", "Approve?")
    request = replace(make_request(timeout=42.0), prompt=old)
    assert await approvals.request(request, prompt.show, settled) is False
    assert prompt.shown == []  # not posted twice
    assert clock.sleeps == [42.0]  # only the time that is left
    assert settled.settled == [(old, TIMED_OUT)]


async def test_a_restart_leaves_the_prompt_as_it_is() -> None:
    approvals = Approvals(["U1"])
    prompt = Prompt()
    request = replace(make_request(), record=Record(restarting=True))
    asking = asyncio.create_task(approvals.request(request, prompt.show, prompt.settle))
    await until(lambda: bool(prompt.shown))
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert prompt.settled == []  # buttons and all, for the next process


async def test_a_click_on_a_request_from_before_a_restart_is_answered_through_the_agent() -> None:
    approvals = Approvals(["U1"], platform="slack")
    old = PromptRef("chat-1", "m3", "Approve?")
    agent, settled = StoreAgent(replace(make_request("old1"), prompt=old)), SettledPrompts()
    click = functools.partial(approvals.resolve_click, agent=agent, settle=settled)
    assert await click("old1", "U2", "Mallory", True) == "not_approver"
    assert agent.answers == []  # never reaches the store
    assert agent.refused == [("old1", "slack", "U2")]  # but the audit log
    assert await click("old1", "U1", "Ann", False) == "ok"
    assert agent.answers == [("old1", False, "Ann")]
    assert settled.settled == [(old, "❌ Denied by Ann")]
    agent.stored = None  # answered already, or unknown
    assert await click("old1", "U1", "Ann", True) == "unknown"
    assert settled.settled == [(old, "❌ Denied by Ann")]
