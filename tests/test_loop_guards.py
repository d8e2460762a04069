"""The loop's guards against the fake LLM: loop detection ladder, doom loop, time limits,
ask_human (docs/durability.md)."""

from __future__ import annotations

import asyncio
import itertools
import time

from pydantic import BaseModel

from core.clock import SystemClock
from core.errors import ToolTransientError
from core.events import LoopEvent, Observed
from core.loop import NUDGE_PREFIX, Guards, LoopConfig, run_loop
from core.messages import Message
from core.resilience import HARD_LIMIT_TEXT, SOFT_LIMIT_PROMPT, LoopDetector, TimeLimits
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.tools.ask import AskHumanTool
from core.tools.base import Category, Tool, ToolContext, ToolRegistry, ToolResult
from core.tools.executor import ToolExecutor
from core.tools.policy import SessionKind, ToolPolicy
from tests.conftest import provider_for
from tests.fakes.clock import FakeClock
from tests.fakes.llm import FakeLLM, Fault, RecordedRequest, Reply, ToolCallSpec
from tests.helpers import EchoArgs, EchoTool


class CounterTool(Tool):
    """Same arguments, a different result each time (thrash, but not a doom loop)."""

    name = "counter"
    description = "Count."
    category: Category = "read"
    params = EchoArgs

    def __init__(self) -> None:
        self.n = itertools.count(1)

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult(f"count {next(self.n)}")


class SlowClockTool(Tool):
    """Advances the injected clock, as a long-running tool would."""

    name = "long_job"
    description = "Takes a long time."
    category: Category = "read"
    params = EchoArgs

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        self.clock.now += self.seconds
        return ToolResult("finished a long job")


def make_executor(*tools: Tool, session: SessionKind = "interactive") -> ToolExecutor:
    return ToolExecutor(
        ToolRegistry(tools), ToolPolicy(session=session), ToolContext(sandbox=SandboxSettings())
    )


def history() -> list[Message]:
    return [Message.system("test"), Message.user("do the thing")]


def user_texts(request_json: dict[str, object]) -> list[str]:
    return [m["content"] for m in request_json["messages"] if m["role"] == "user"]  # type: ignore[attr-defined,index]


async def test_doom_loop_ends_the_run_and_says_why(fake_llm: FakeLLM) -> None:
    fake_llm.responder = lambda _r: Reply(tool_calls=[ToolCallSpec("echo", {"text": "same"})])
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(EchoTool()),
        guards=Guards(detector=LoopDetector()),
    )
    assert outcome.reason == "doom_loop"
    assert len(fake_llm.requests) == 3
    assert "`echo`" in outcome.text
    assert "same result" in outcome.text
    assert messages[-1] == Message.assistant(outcome.text)


async def test_identical_thrash_escalates_l1_l2_l3_in_order(fake_llm: FakeLLM) -> None:
    fake_llm.responder = lambda _r: Reply(tool_calls=[ToolCallSpec("counter", {"text": "x"})])
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(CounterTool()),
        config=LoopConfig(max_iterations=20),
        guards=Guards(detector=LoopDetector()),
    )
    nudges = [
        m.content for m in messages if m.role == "user" and m.content.startswith(NUDGE_PREFIX)
    ]
    assert len(nudges) == 2  # L1 then L2, each seen by the model
    assert "Stop calling" not in nudges[0]
    assert "Stop calling" in nudges[1]
    assert NUDGE_PREFIX + nudges[0].removeprefix(NUDGE_PREFIX) in user_texts(
        fake_llm.requests[3].json
    )
    assert outcome.reason == "waiting_on_human"  # L3 in interactive chat: ask the human
    assert len(fake_llm.requests) == 9


async def test_thrash_in_a_cron_session_stops_with_a_summary(fake_llm: FakeLLM) -> None:
    def respond(request: RecordedRequest) -> Reply:
        if "tools" not in request.json:  # the tool-less summary turn
            return Reply(text="Summary: counted to 9.")
        return Reply(tool_calls=[ToolCallSpec("counter", {"text": "x"})])

    fake_llm.responder = respond
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(CounterTool(), session="cron"),
        guards=Guards(detector=LoopDetector()),
    )
    assert outcome.reason == "loop_stop"
    assert "counter" in outcome.text  # why it stopped
    assert outcome.text.endswith("Summary: counted to 9.")  # and what was done
    assert user_texts(fake_llm.requests[-1].json)[-1] == SOFT_LIMIT_PROMPT


class SearchTool(Tool):
    """Finds nothing, whatever it is asked."""

    name = "search"
    description = "Search."
    category: Category = "read"
    params = EchoArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return ToolResult("no results")


async def test_pattern_thrash_nudges_the_model(fake_llm: FakeLLM) -> None:
    texts = iter(["a", "b", "c", "d"])
    fake_llm.responder = lambda _r: (
        Reply(tool_calls=[ToolCallSpec("search", {"text": t})])
        if (t := next(texts, None))
        else Reply(text="ok, giving up")
    )
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(SearchTool()),
        guards=Guards(detector=LoopDetector()),
    )
    assert outcome.reason == "final"
    nudges = [m for m in messages if m.role == "user" and m.content.startswith(NUDGE_PREFIX)]
    assert len(nudges) == 1
    assert "search" in nudges[0].content


async def test_reading_20_different_files_finishes_with_the_answer(fake_llm: FakeLLM) -> None:
    paths = iter([f"file{i}.txt" for i in range(20)])
    fake_llm.responder = lambda _r: (
        Reply(tool_calls=[ToolCallSpec("echo", {"text": p})])
        if (p := next(paths, None))
        else Reply(text="read them all")
    )
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(EchoTool()),
        config=LoopConfig(max_iterations=30),
        guards=Guards(detector=LoopDetector()),
    )
    assert (outcome.reason, outcome.text) == ("final", "read them all")
    assert not [m for m in messages if m.role == "user" and m.content.startswith(NUDGE_PREFIX)]


async def test_three_identical_calls_still_stop_the_run(fake_llm: FakeLLM) -> None:
    fake_llm.responder = lambda _r: Reply(tool_calls=[ToolCallSpec("search", {"text": "x"})])
    outcome = await run_loop(
        history(),
        provider_for(fake_llm),
        make_executor(SearchTool()),
        config=LoopConfig(max_iterations=30),
        guards=Guards(detector=LoopDetector()),
    )
    assert outcome.reason in {"doom_loop", "loop_stop"}


async def test_soft_time_limit_gives_one_summary_turn_without_tools(fake_llm: FakeLLM) -> None:
    clock = FakeClock()
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("long_job", {"text": "build"})]),
        Reply(text="Summary: I ran the long job."),
    )
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(SlowClockTool(clock, 950)),
        guards=Guards(limits=TimeLimits(soft=900, hard=1200, clock=clock)),
    )
    assert outcome.reason == "time_limit"
    assert outcome.text == "Summary: I ran the long job."
    last = fake_llm.requests[-1].json
    assert "tools" not in last
    assert user_texts(last)[-1] == SOFT_LIMIT_PROMPT
    fake_llm.assert_complete()


async def test_hard_time_limit_aborts(fake_llm: FakeLLM) -> None:
    clock = FakeClock()
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("long_job", {"text": "build"})]))
    messages = history()
    outcome = await run_loop(
        messages,
        provider_for(fake_llm),
        make_executor(SlowClockTool(clock, 1300)),
        guards=Guards(limits=TimeLimits(soft=900, hard=1200, clock=clock)),
    )
    assert (outcome.reason, outcome.text) == ("time_limit", HARD_LIMIT_TEXT)
    assert len(fake_llm.requests) == 1  # no further LLM call
    assert messages[-1] == Message.assistant(HARD_LIMIT_TEXT)


async def test_ask_human_ends_the_turn_with_the_question(fake_llm: FakeLLM) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("ask_human", {"question": "Which branch?"}, id="q")]),
        Reply(text="Deploying main."),
    )
    messages = history()
    executor = make_executor(AskHumanTool())
    outcome = await run_loop(messages, provider_for(fake_llm), executor)
    assert (outcome.reason, outcome.text) == ("waiting_on_human", "Which branch?")
    # The user's answer continues a valid transcript (the fake rejects unpaired calls).
    messages.append(Message.user("main"))
    outcome = await run_loop(messages, provider_for(fake_llm), executor)
    assert outcome.text == "Deploying main."
    assert fake_llm.requests[1].error is None


async def test_guard_events_reach_the_runs_sink(fake_llm: FakeLLM) -> None:
    """Guards and the executor are built once per conversation without a sink (as the app
    does); every run's events must still reach that run's sink."""
    clock = FakeClock()
    fake_llm.responder = lambda _r: Reply(tool_calls=[ToolCallSpec("echo", {"text": "same"})])
    events: list[LoopEvent] = []
    await run_loop(
        history(),
        provider_for(fake_llm),
        make_executor(EchoTool()),
        ctx=RunContext(sink=events.append),
        guards=Guards(detector=LoopDetector(), limits=TimeLimits(clock=clock)),
    )
    names = {e.name for e in events if isinstance(e, Observed)}
    assert "agent.loop.detected" in names


class FlakyOnceTool(Tool):
    """Fails once with a transient error, then works (a retry event follows)."""

    name = "flaky"
    description = "Fails once."
    category: Category = "read"
    params = EchoArgs

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        self.runs += 1
        if self.runs == 1:
            raise ToolTransientError("503 from upstream")
        return ToolResult("ok")


async def test_a_second_run_gets_its_own_time_limit_and_retry_events(fake_llm: FakeLLM) -> None:
    """One `Guards` and one executor serve two runs (as in a conversation): the second
    run's soft-limit and retry events go to the second run's sink, not the first's."""
    clock = FakeClock()
    guards = Guards(limits=TimeLimits(soft=10, hard=100, clock=clock))
    executor = make_executor(FlakyOnceTool(), SlowClockTool(clock, 20))
    executor.clock = clock  # retry backoff sleeps on the fake clock
    provider = provider_for(fake_llm)
    fake_llm.script(Reply(text="first done"))
    first: list[LoopEvent] = []
    await run_loop(history(), provider, executor, ctx=RunContext(sink=first.append), guards=guards)
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("flaky", {"text": "x"}),
                ToolCallSpec("long_job", {"text": "y"}),
            ]
        ),
        Reply(text="summary of the work"),
    )
    second: list[LoopEvent] = []
    await run_loop(history(), provider, executor, ctx=RunContext(sink=second.append), guards=guards)
    names = [e.name for e in second if isinstance(e, Observed)]
    assert "agent.tool.retry" in names
    assert "agent.exhaustion.soft_limit" in names
    assert not [e for e in first if isinstance(e, Observed)]


async def _hard_limited(fake_llm: FakeLLM, tmp_path: object, hard: float) -> tuple[object, float]:
    from pathlib import Path

    from core.context.transcript import is_valid
    from core.tools.builtin import BashTool

    assert isinstance(tmp_path, Path)
    sandbox = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(sandbox))
    messages = history()
    started = time.monotonic()
    async with asyncio.timeout(20):  # without the limit this would run for minutes
        outcome = await run_loop(
            messages,
            provider_for(fake_llm, clock=SystemClock()),  # type: ignore[arg-type]
            executor,
            guards=Guards(limits=TimeLimits(soft=hard / 2, hard=hard)),
        )
    elapsed = time.monotonic() - started
    assert is_valid(messages)
    assert messages[-1].content == HARD_LIMIT_TEXT
    return outcome, elapsed


UNBOUNDED = 60.0  # the shortest of what each test below would take without the hard limit


async def test_the_hard_limit_ends_an_endless_stream(fake_llm: FakeLLM, tmp_path: object) -> None:
    fake_llm.script(Reply(text="word " * 100_000, chunk_size=5, chunk_delay=0.01))
    outcome, elapsed = await _hard_limited(fake_llm, tmp_path, hard=1.5)
    assert outcome.reason == "time_limit"  # type: ignore[attr-defined]
    assert 1.5 <= elapsed < UNBOUNDED / 4  # the stream alone would run for minutes


async def test_the_hard_limit_ends_a_long_retry_after_wait(
    fake_llm: FakeLLM, tmp_path: object
) -> None:
    fake_llm.script(Reply(fault=Fault(status=429, retry_after=120)), Reply(text="too late"))
    outcome, elapsed = await _hard_limited(fake_llm, tmp_path, hard=1.5)
    assert outcome.reason == "time_limit"  # type: ignore[attr-defined]
    assert elapsed < UNBOUNDED / 4  # the server asked for 120 s


async def test_the_hard_limit_ends_a_long_tool(fake_llm: FakeLLM, tmp_path: object) -> None:
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": "sleep 60"})]))
    outcome, elapsed = await _hard_limited(fake_llm, tmp_path, hard=1.5)
    assert outcome.reason == "time_limit"  # type: ignore[attr-defined]
    assert elapsed < UNBOUNDED / 4  # the tool alone sleeps 60 s
