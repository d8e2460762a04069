"""Tool retries in the executor (docs/durability.md): transient failures of idempotent tools are
retried with backoff on an injected clock; side-effecting tools never are."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from core.clock import SystemClock
from core.errors import ToolDenied, ToolTransientError
from core.events import LoopEvent, Observed
from core.messages import Message, ToolCall
from core.run_context import RunContext
from core.tools.base import Category, Tool, ToolContext, ToolRegistry, ToolResult
from core.tools.executor import MAX_RETRY_AFTER, RETRY_DELAYS, ToolExecutor
from core.tools.policy import ToolPolicy
from tests.fakes.clock import FakeClock


class QueryArgs(BaseModel):
    q: str


class FlakyTool(Tool):
    """Raises the queued exceptions one per run, then succeeds; counts its runs."""

    description = "A lookup over a flaky service."
    params = QueryArgs

    def __init__(
        self, failures: list[BaseException], name: str = "lookup", category: Category = "read"
    ) -> None:
        self.name = name
        self.category = category
        self.failures = list(failures)
        self.runs = 0

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        self.runs += 1
        if self.failures:
            raise self.failures.pop(0)
        return ToolResult("found it")


class BlockingClock:
    """A clock whose sleeps never end on their own, to cancel a run mid-backoff."""

    def __init__(self) -> None:
        self.sleeping = asyncio.Event()
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.sleeping.set()
        await asyncio.Event().wait()


class RunOf:
    """An executor driven for one run whose events land in `events`."""

    def __init__(self, executor: ToolExecutor, events: list[LoopEvent]) -> None:
        self.executor, self.run = executor, RunContext(sink=events.append)

    async def execute(self, call: ToolCall) -> Message:
        return await self.executor.execute(call, self.run)


def make(
    tool: Tool, clock: FakeClock | BlockingClock | None = None, policy: ToolPolicy | None = None
) -> tuple[RunOf, list[LoopEvent]]:
    events: list[LoopEvent] = []
    executor = ToolExecutor(
        ToolRegistry([tool]), policy or ToolPolicy(), ToolContext(), clock=clock or FakeClock()
    )
    return RunOf(executor, events), events


def call(name: str = "lookup", arguments: str = '{"q": "x"}') -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=arguments)


def unavailable() -> ToolTransientError:
    return ToolTransientError("HTTP 503 Service Unavailable", status=503)


async def test_transient_failure_then_success_is_retried_once() -> None:
    tool, clock = FlakyTool([unavailable()]), FakeClock()
    executor, events = make(tool, clock)
    result = await executor.execute(call())
    assert (result.content, result.is_error) == ("found it", False)
    assert tool.runs == 2
    assert clock.sleeps == [0.5]
    assert events == [
        Observed(
            "agent.tool.retry",
            {
                "tool": "lookup",
                "call_id": "c1",
                "attempt": 1,
                "delay": 0.5,
                "error": "HTTP 503 Service Unavailable",
            },
        )
    ]


async def test_retry_after_longer_than_backoff_is_honoured() -> None:
    tool, clock = FlakyTool([ToolTransientError("429", status=429, retry_after=5)]), FakeClock()
    executor, _ = make(tool, clock)
    result = await executor.execute(call())
    assert not result.is_error
    assert clock.sleeps == [5]


async def test_retry_after_shorter_than_backoff_keeps_backoff() -> None:
    tool = FlakyTool([unavailable(), ToolTransientError("429", retry_after=0.1)])
    clock = FakeClock()
    executor, _ = make(tool, clock)
    assert not (await executor.execute(call())).is_error
    assert clock.sleeps == [0.5, 2.0]


async def test_retry_after_too_long_is_reported_not_waited_for() -> None:
    tool = FlakyTool([ToolTransientError("429", retry_after=MAX_RETRY_AFTER + 1)])
    clock = FakeClock()
    executor, _ = make(tool, clock)
    result = await executor.execute(call())
    assert result.is_error
    assert "asked to wait 61 s" in result.content
    assert (tool.runs, clock.sleeps) == (1, [])


async def test_persistent_failure_gives_up_and_says_how_often_it_tried() -> None:
    tool, clock = FlakyTool([unavailable() for _ in range(10)]), FakeClock()
    executor, events = make(tool, clock)
    result = await executor.execute(call())
    assert result.is_error
    assert result.content.startswith("error: HTTP 503 Service Unavailable")
    assert "tried 4 times" in result.content
    assert tool.runs == len(RETRY_DELAYS) + 1 == 4
    assert clock.sleeps == [0.5, 2.0, 8.0]
    retries = [e for e in events if isinstance(e, Observed)]
    assert [e.data["attempt"] for e in retries] == [1, 2, 3]
    assert [e.data["delay"] for e in retries] == [0.5, 2.0, 8.0]


async def test_timeout_is_transient() -> None:
    tool, clock = FlakyTool([TimeoutError()]), FakeClock()
    executor, events = make(tool, clock)
    assert not (await executor.execute(call())).is_error
    assert clock.sleeps == [0.5]
    assert isinstance(events[0], Observed)
    assert "timed out" in events[0].data["error"]


async def test_side_effecting_tool_is_never_retried() -> None:
    tool, clock = FlakyTool([unavailable()], name="send_email", category="write"), FakeClock()
    executor, events = make(tool, clock)
    result = await executor.execute(call("send_email"))
    assert result.is_error
    assert "not retried: send_email has side effects" in result.content
    assert (tool.runs, clock.sleeps, events) == (1, [], [])


async def test_tool_declaring_itself_not_idempotent_is_not_retried() -> None:
    class NotIdempotent(FlakyTool):
        @property
        def idempotent(self) -> bool:
            return False

    tool, clock = NotIdempotent([unavailable()]), FakeClock()
    executor, _ = make(tool, clock)
    assert "not retried" in (await executor.execute(call())).content
    assert (tool.runs, clock.sleeps) == (1, [])


@pytest.mark.parametrize(
    "failure", [ToolDenied("no"), RuntimeError("bug"), ValueError("bad")], ids=repr
)
async def test_non_transient_failures_are_not_retried(failure: BaseException) -> None:
    tool, clock = FlakyTool([failure]), FakeClock()
    executor, _ = make(tool, clock)
    assert (await executor.execute(call())).is_error
    assert (tool.runs, clock.sleeps) == (1, [])


async def test_validation_error_is_not_retried() -> None:
    tool, clock = FlakyTool([unavailable()]), FakeClock()
    executor, _ = make(tool, clock)
    result = await executor.execute(call(arguments='{"nope": 1}'))
    assert result.is_error
    assert (tool.runs, clock.sleeps) == (0, [])


async def test_policy_denial_is_not_retried() -> None:
    tool = FlakyTool([unavailable()], name="post", category="write")
    clock = FakeClock()
    executor, _ = make(tool, clock, ToolPolicy(session="cron"))
    result = await executor.execute(call("post"))
    assert "allow_tools" in result.content
    assert (tool.runs, clock.sleeps) == (0, [])


async def test_cancel_during_backoff_sleep_propagates() -> None:
    tool, clock = FlakyTool([unavailable(), unavailable()]), BlockingClock()
    executor, _ = make(tool, clock)
    task = asyncio.create_task(executor.execute(call()))
    await asyncio.wait_for(clock.sleeping.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (tool.runs, clock.sleeps) == (1, [0.5])


async def test_cancellation_raised_by_the_tool_is_not_retried() -> None:
    tool, clock = FlakyTool([asyncio.CancelledError()]), FakeClock()
    executor, _ = make(tool, clock)
    with pytest.raises(asyncio.CancelledError):
        await executor.execute(call())
    assert (tool.runs, clock.sleeps) == (1, [])


def test_positional_construction_still_works() -> None:
    executor = ToolExecutor(ToolRegistry(), ToolPolicy(), ToolContext())
    assert isinstance(executor.clock, SystemClock)  # the default clock is the real one
