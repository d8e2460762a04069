"""The pre-flight check: each stage fires at its threshold and not before (window 1000:
soft 600, compact 700, hard 950), with message sizes known exactly via `WordCounter`."""

from __future__ import annotations

import logging

import pytest

from core.context.manager import (
    DEEP_MARKER,
    SUMMARY_HEADER,
    ContextManager,
    ContextSettings,
)
from core.context.transcript import PINNED_HEADER, is_valid
from core.errors import ContextLimitExceeded
from core.events import CompactionProgress
from core.messages import Message, ToolCall
from tests.context import Sink, WordCounter, reply, system, tool_turn, user

WINDOW = 1000


class Recorder:
    """A summarizer that records its inputs; `fail` makes it raise."""

    def __init__(self, text: str = "the user asked for things", fail: bool = False) -> None:
        self.text, self.fail = text, fail
        self.inputs: list[str] = []

    async def __call__(self, prompt: str) -> str:
        self.inputs.append(prompt)
        if self.fail:
            raise RuntimeError("summary model down")
        return self.text


def manager(
    summarizer: Recorder | None = None, session: str = "interactive", **overrides: int
) -> ContextManager:
    return ContextManager(
        WINDOW,
        WordCounter(),
        summarizer,
        ContextSettings(**overrides),  # type: ignore[arg-type]
        session=session,  # type: ignore[arg-type]
    )


def sized(body: list[Message], total: int) -> list[Message]:
    """System message sized so the whole history is exactly `total` tokens."""
    rest = sum(WordCounter().message(m) for m in body)
    assert rest + 5 <= total, f"test data: body is {rest} tokens"
    return [system(total - rest), *body]


def chat(pairs: int, size: int = 30) -> list[Message]:
    out: list[Message] = []
    for i in range(pairs):
        out += [user(size, f"q{i}"), reply(size, f"a{i}")]
    return out


def tools(n: int, size: int = 40) -> list[Message]:
    return [m for i in range(n) for m in tool_turn(f"c{i}", f"tool{i % 3}", size)]


async def test_below_soft_only_counts() -> None:
    cm, sink = manager(Recorder()), Sink()
    messages = sized([user(20), *tools(10)], 599)
    before = list(messages)
    assert await cm.preflight(messages, sink) == "ok"
    assert all(x is y for x, y in zip(messages, before, strict=True))
    assert sink.events == []


async def test_mask_fires_at_soft() -> None:
    cm, sink = manager(Recorder()), Sink()
    body = [user(20), *tools(10)]  # 21 messages: the first 11 are outside the tail
    messages = sized(body, 600)
    assert await cm.preflight(messages, sink) == "ok"
    [event] = sink.named("agent.compaction.run")
    assert event["kind"] == "mask"
    assert event["before"] == 600
    assert isinstance(event["after"], int)
    assert event["after"] < 600
    placeholder = cm.settings.mask_placeholder
    old, tail = messages[:-10], messages[-10:]
    masked = [m for m in old if m.role == "tool"]
    assert masked
    assert all(m.content == placeholder for m in masked)
    assert [m.tool_call_id for m in masked] == ["c0", "c1", "c2", "c3", "c4"]
    assert masked[0].name == "tool0"
    assert all(m.content != placeholder for m in tail)
    assert cm.tokens(messages) == event["after"]
    assert cm.last_compaction is not None
    assert cm.last_compaction.kind == "mask"


async def test_r1_fires_at_compact_and_not_before() -> None:
    summarizer = Recorder()
    cm, sink = manager(summarizer), Sink()
    messages = sized(chat(10), 699)  # no tool output: masking cannot help
    assert await cm.preflight(messages, sink) == "ok"
    assert sink.events == []
    assert summarizer.inputs == []

    messages = sized(chat(10), 700)
    tail = messages[-10:]
    assert await cm.preflight(messages, sink) == "ok"
    assert messages[0].role == "system"
    assert messages[1].content.startswith(SUMMARY_HEADER)
    assert "the user asked for things" in messages[1].content
    assert all(x is y for x, y in zip(messages[-10:], tail, strict=True))
    [run] = sink.named("agent.compaction.run")
    assert (run["kind"], run["before"], run["summary"]) == ("R1", 700, "llm")
    [fired] = sink.named("agent.recovery.fired")
    assert fired == {"stage": "R1", "before": 700, "after": run["after"]}
    assert cm.tokens(messages) == run["after"] < 700
    assert len(summarizer.inputs) == 1
    assert "q0" in summarizer.inputs[0]


@pytest.mark.parametrize("summarizer", [Recorder(fail=True), None])
async def test_summary_failure_falls_back_to_truncation(summarizer: Recorder | None) -> None:
    cm, sink = manager(summarizer), Sink()
    messages = sized(chat(10), 800)
    assert await cm.preflight(messages, sink) == "ok"
    summary = messages[1].content
    assert summary.startswith(SUMMARY_HEADER)
    assert "Automatic summary unavailable: 10 earlier messages were dropped" in summary
    assert "- q0 q0" in summary  # first line of each user request
    assert sink.named("agent.compaction.run")[0]["summary"] == "truncation"
    assert cm.tokens(messages) < 700
    assert is_valid(messages)


async def test_summarizer_input_is_bounded_oldest_cut_first() -> None:
    summarizer = Recorder()
    cm = ContextManager(
        20_000, WordCounter(), summarizer, ContextSettings(summary_max_input_tokens=300)
    )
    messages = sized(chat(60, size=100), 15_000)
    await cm.compact(messages, sink=Sink())
    prompt = summarizer.inputs[0]
    assert len(prompt.split()) <= 300
    assert "older messages omitted" in prompt
    assert "q0" not in prompt  # the oldest went first
    assert "a54" in prompt  # the newest summarised message is in


async def test_calls_stay_with_results_and_tools_are_pinned() -> None:
    cm, sink = manager(Recorder()), Sink()
    body = [
        user(20, "task"),
        *tool_turn("p1", "search", 30, tag="old"),
        *tool_turn("p2", "search", 30, tag="latest"),
        *tool_turn("p3", "search", 30, tag="error", error=True),
        *tool_turn("p4", "fetch", 30, tag="page"),
        *chat(3),
        *[m for i in range(5) for m in tool_turn(f"x{i}", "list", 10)],
    ]
    # A 3-call block, then 8 replies: the 10-message boundary falls inside the block.
    calls = tuple(ToolCall(id=f"y{i}", name="ls") for i in range(3))
    block = Message.assistant("", calls)
    body += [block, *(Message.tool_result(c, "ok") for c in calls)]
    body += [reply(10, f"f{i}") for i in range(8)]
    messages = sized(body, 900)  # masking alone cannot get under 700
    assert await cm.preflight(messages, sink) == "ok"
    assert is_valid(messages)
    assert messages[-12] is block  # the boundary moved back to the call message
    summary = messages[1].content
    assert PINNED_HEADER in summary
    assert "latest latest" in summary
    assert "page page" in summary
    assert "old old" not in summary
    assert "error error" not in summary
    kept_ids = {m.tool_call_id for m in messages if m.role == "tool"}
    assert {"y0", "y1", "y2"} <= kept_ids


async def test_latest_user_request_kept_verbatim() -> None:
    cm = manager(Recorder())
    request = user(30, "please")
    messages = sized([request, *(reply(30, f"a{i}") for i in range(20))], 800)
    await cm.preflight(messages, Sink())
    assert messages[1].content.startswith(SUMMARY_HEADER)
    assert messages[2] is request
    assert is_valid(messages)


async def test_r2_right_after_r1_when_the_tail_is_too_big() -> None:
    cm, sink = manager(Recorder()), Sink()
    messages = sized([*chat(2), *chat(5, size=75)], 900)
    assert await cm.preflight(messages, sink) == "ok"
    stages = [e["stage"] for e in sink.named("agent.recovery.fired")]
    assert stages == ["R1", "R2"]
    assert messages[1].content.startswith(f"{SUMMARY_HEADER} {DEEP_MARKER}")
    assert len(messages) == 1 + 1 + 4  # system, summary, deep_keep
    assert cm.tokens(messages) < 700


async def test_r2_within_20_iterations_of_r1_then_r1_again_after() -> None:
    cm, sink = manager(Recorder()), Sink()
    messages = sized(chat(12), 750)
    await cm.preflight(messages, sink)  # iteration 1: R1
    for _ in range(5):
        await cm.preflight(messages, sink)
    messages += chat(6, size=40)  # over compact again at iteration 7
    await cm.preflight(messages, sink)
    assert [e["stage"] for e in sink.named("agent.recovery.fired")] == ["R1", "R2"]
    for _ in range(21):
        await cm.preflight(messages, sink)
    messages += chat(8, size=40)
    await cm.preflight(messages, sink)  # > 20 iterations after R2: start over at R1
    assert [e["stage"] for e in sink.named("agent.recovery.fired")] == ["R1", "R2", "R1"]


@pytest.mark.parametrize(("session", "verdict"), [("interactive", "ask_human"), ("cron", "stop")])
async def test_r3_asks_the_human_or_stops(session: str, verdict: str) -> None:
    cm, sink = manager(Recorder(), session=session), Sink()
    huge = user(700, "huge")  # the latest request is kept verbatim, so nothing helps
    messages = sized([*chat(2), huge], 900)
    assert await cm.preflight(messages, sink) == verdict
    assert [e["stage"] for e in sink.named("agent.recovery.fired")] == ["R1", "R2", "R3"]
    assert any(m is huge for m in messages)


async def test_at_most_four_recoveries_then_the_hard_limit() -> None:
    cm, sink = manager(Recorder()), Sink()
    messages = sized([*chat(1), user(900, "huge")], 980)
    assert await cm.preflight(messages, sink) == "ask_human"  # R1, R2, R3
    assert await cm.preflight(messages, sink) == "ask_human"  # R3 again: 4th recovery
    with pytest.raises(ContextLimitExceeded) as info:
        await cm.preflight(messages, sink)  # budget spent: straight to the hard check
    assert len(sink.named("agent.recovery.fired")) == 4
    assert info.value.limit_tokens == 950
    assert info.value.estimated_tokens == cm.tokens(messages) >= 950
    assert "limit 950" in str(info.value)
    cm.start_turn()  # a new turn gets a new budget
    assert await cm.preflight(messages, sink) == "ask_human"


async def test_hard_limit_fires_at_its_threshold() -> None:
    cm = manager(max_recoveries=0)
    assert await cm.preflight(sized([user(10)], 949), Sink()) == "ok"
    with pytest.raises(ContextLimitExceeded) as info:
        await cm.preflight(sized([user(10)], 950), Sink())
    assert (info.value.estimated_tokens, info.value.limit_tokens) == (950, 950)


async def test_manual_compact_reaches_half() -> None:
    cm, sink = manager(Recorder()), Sink()
    messages = sized([*chat(6), *tools(4, size=40)], 650)  # below compact
    report = await cm.compact(messages, sink=sink)
    assert (report.kind, report.before) == ("manual", 650)
    assert report.after == cm.tokens(messages) <= 500
    assert cm.last_compaction == report
    assert is_valid(messages)


async def test_preflight_repairs_the_transcript() -> None:
    cm, sink = manager(), Sink()
    [call, _] = tool_turn("z", "ls", 10)
    messages = [system(10), user(10), call]  # interrupted: no result
    await cm.preflight(messages, sink)
    assert sink.named("agent.transcript.repaired") == [{"synthesized": 1, "dropped": 0, "moved": 0}]
    assert is_valid(messages)


async def test_tokens_and_preflight_are_incremental() -> None:
    counter = WordCounter()
    cm = ContextManager(10**9, counter, None, ContextSettings())
    messages = [system(10), *chat(500)]
    assert cm.tokens(messages) == 10 + 1000 * 30
    counter.message_calls = 0
    messages += [user(10), reply(10)]
    assert cm.tokens(messages) == 10 + 1000 * 30 + 20
    assert counter.message_calls == 2  # only the new messages
    counter.message_calls = 0
    messages += [user(10)]
    assert await cm.preflight(messages, Sink()) == "ok"
    assert counter.message_calls == 1
    counter.message_calls = 0
    messages[0] = system(20)  # not an append: recount everything
    assert cm.tokens(messages) == 10 + 1000 * 30 + 40
    assert counter.message_calls == len(messages)


@pytest.mark.parametrize(("batch", "masks"), [(8, 0), (1, 2)])
async def test_masking_rewrites_history_in_batches(batch: int, masks: int) -> None:
    """Once outputs are masked, the next masking waits for `mask_batch` more to age out of
    the tail: each rewrite breaks the provider's prompt cache (docs/cost.md). `mask_batch
    = 1` masks on every call, as before."""
    cm, sink = manager(Recorder(), mask_batch=batch), Sink()
    messages = sized([user(20), *tools(10)], 650)
    assert await cm.preflight(messages, sink) == "ok"
    assert len(sink.named("agent.compaction.run")) == 1  # the first masking always runs
    for i in range(2):  # each new round ages one more output out of the tail
        messages += tool_turn(f"n{i}", "tool0", 64)
        before = list(messages)
        assert cm.soft_at <= cm.tokens(messages) < cm.compact_at  # masking's range
        assert await cm.preflight(messages, sink) == "ok"
        if batch > 1:
            assert all(x is y for x, y in zip(messages, before, strict=True))  # untouched
    assert len(sink.named("agent.compaction.run")) == 1 + masks


async def test_each_hard_compaction_reports_progress_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R1 and R2 each tell the channel as they start and when done (a transient status),
    and log one INFO line with the tokens before, after and saved (docs/context.md)."""
    cm, sink = manager(Recorder()), Sink()
    messages = sized([*chat(2), *chat(5, size=75)], 900)
    with caplog.at_level(logging.INFO, logger="core.context.manager"):
        assert await cm.preflight(messages, sink) == "ok"
    progress = [e for e in sink.events if isinstance(e, CompactionProgress)]
    fired = sink.named("agent.recovery.fired")
    assert [(p.stage, p.after is None) for p in progress] == [
        ("R1", True),
        ("R1", False),
        ("R2", True),
        ("R2", False),
    ]
    assert [(p.before, p.after) for p in progress[1::2]] == [
        (f["before"], f["after"]) for f in fired
    ]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compaction R")]
    before, after = fired[0]["before"], fired[0]["after"]
    assert lines[0] == f"compaction R1: {before} → {after} tokens (saved {before - after})"  # type: ignore[operator]
    assert len(lines) == 2
    assert progress[1].line.startswith("Compacting: ")
