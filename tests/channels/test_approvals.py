"""Approval prompts: who decides, timeouts, settling the prompt (channels/approvals.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from channels.approvals import (
    CANCELLED,
    TIMED_OUT,
    Approvals,
    approval_button_id,
    parse_approval_button,
)
from core.chat import ApprovalRequest
from core.clock import FakeClock


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
    assert parse_approval_button(yes) == ("a1b2c3d4e5f6", True)
    assert parse_approval_button(no) == ("a1b2c3d4e5f6", False)
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
