"""Enforced budgets (docs/cost.md#budgets): a budget at its edge refuses the next call
with a message naming it, what was spent and when it resets, and the run ends cleanly;
an unpriceable model under `unpriced = "deny"`; `/budget` for admins; config errors."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from core.chat import Asker
from core.cost.meter import Who, periods
from core.errors import ConfigError
from tests.agentkit import RecordingResponder, agent_config, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply

# USD per million tokens: an input token costs 0.01 cents, an output token 0.1 cents.
PRICES = {"fake-model": {"input": 100.0, "output": 1000.0}}
PROVIDERS = {"fake": {"max_output_tokens": 300}}
CONSOLE = ("console", "local", "")  # whoever runs Parley: an admin


def tomorrow() -> str:
    return (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()


async def test_a_budget_at_its_edge_refuses_the_next_call_and_ends_the_run(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    # The first call costs 2,000 tokens in and 300 out = $0.50 of the $0.90 a day; the next
    # one's worst case (its prompt, system and tools included, and 300 tokens out: more
    # than $0.40) does not fit in what is left.
    fake_llm.script(Reply(text="one", usage=(2_000, 300)), Reply(text="two", usage=(10, 10)))
    async with running_agent(
        fake_llm,
        tmp_path,
        prices=PRICES,
        providers=PROVIDERS,
        budgets={"per_user_day": 0.9},
    ) as agent:
        chat = RecordingResponder()
        first = await agent.run(inbound("first"), chat)
        assert first.text == "one"
        refused = await agent.run(inbound("second"), chat)
        assert refused.state == "completed"  # ended cleanly, not failed
        assert refused.stop_reason == "budget"
        assert refused.text.startswith(
            "Stopped: the per_user_day budget is reached ($0.50 of $0.90 spent; "
            "the next call could cost up to $0.4"
        )
        assert f"It resets at {tomorrow()} 00:00 UTC; an admin can raise it with /budget." in (
            refused.text
        )
        assert chat.finals[-1] == refused.text  # said, not a silent stop
        assert len(fake_llm.requests) == 1  # the refused call was never sent
        # nothing lost: the message is in the history, followed by the refusal
        lane = await agent.lane(("test", "c1", ""))
        conversation = await agent.conversation_of(lane)
        assert [m.content for m in conversation.messages[-2:]] == ["second", refused.text]
        stored = await agent.store.load_messages(lane.conv_id)
        assert stored[-1].content == refused.text
        names = [name for _, name, _, _ in await agent.store.events(refused.run_id)]
        assert "budget.refused" in names
        # another person in the same chat has a day of their own
        other = await agent.run(inbound("mine", user_id="u2"), chat)
        assert other.text == "two"


async def test_an_admin_sees_and_raises_a_budget(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="one", usage=(2_000, 300)), Reply(text="two", usage=(10, 10)))
    async with running_agent(
        fake_llm,
        tmp_path,
        prices=PRICES,
        providers=PROVIDERS,
        budgets={"per_channel_month": 0.9},
    ) as agent:
        chat = RecordingResponder()
        await agent.run(inbound("first", key=CONSOLE), chat)
        assert (await agent.run(inbound("again", key=CONSOLE), chat)).stop_reason == "budget"
        await agent.submit(inbound("/budget", key=CONSOLE), chat)
        assert "per_channel_month: $0.50 of $0.90 spent here; resets at" in chat.sent[-1]
        # a chat's members who are not approvers may look, not change
        await agent.submit(inbound("/budget set per_channel_month 5"), chat)
        assert chat.sent[-1] == "Only admins (this channel's approvers) can change a budget."
        await agent.submit(inbound("/budget set total_month 5", key=CONSOLE), chat)
        assert chat.sent[-1].startswith("No budget total_month is configured")
        await agent.submit(inbound("/budget set per_channel_month 5", key=CONSOLE), chat)
        assert chat.sent[-1] == "The per_channel_month budget is now $5.00."
        again = await agent.run(inbound("once more", key=CONSOLE), chat)
        assert again.text == "two"
    log = (tmp_path / "events.jsonl").read_text()
    assert '"event": "budget.changed"' in log


async def test_an_unpriceable_model_is_denied_once_a_budget_is_set(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="free"))
    async with running_agent(fake_llm, tmp_path, budgets={"total_month": 10.0}) as agent:
        chat = RecordingResponder()
        report = await agent.run(inbound("hello"), chat)
    assert report.stop_reason == "budget"
    assert report.text.startswith("Stopped: the model fake-model has no known price")
    assert '[prices."fake-model"]' in report.text
    assert fake_llm.requests == []


async def test_unpriced_allow_lets_an_unpriceable_model_through(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="free"))
    budgets = {"total_month": 10.0, "unpriced": "allow"}
    async with running_agent(fake_llm, tmp_path, budgets=budgets) as agent:
        report = await agent.run(inbound("hello"), RecordingResponder())
        await agent.store.flush()
        [call] = await agent.store.llm_calls(0)
    assert report.text == "free"
    assert call.cost is None


def test_budget_periods_and_when_they_reset() -> None:
    now = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    chat = Who("r1", "slack:C1:1", "slack:U1", "slack:C1", "")
    assert [(p.budget, p.key, p.resets) for p in periods(chat, now)] == [
        ("total_month", "total_month:2026-12", "2027-01-01 00:00 UTC"),
        ("per_user_day", "per_user_day:slack:U1:2026-12-31", "2027-01-01 00:00 UTC"),
        ("per_channel_month", "per_channel_month:slack:C1:2026-12", "2027-01-01 00:00 UTC"),
    ]
    job = Who("r2", "cron:daily:1", "", "", "daily")
    assert [p.key for p in periods(job, now)] == ["total_month:2026-12", "per_job_run:r2"]


def test_a_triggers_run_spends_in_the_scope_of_its_trigger() -> None:
    now = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC).timestamp()
    run = Who.of("r3", "trigger:ci:abc", Asker("trigger", "ci", "", False, "trigger:ci:abc"))
    assert run == Who("r3", "trigger:ci:abc", "", "", "trigger:ci")
    assert [(p.budget, p.key) for p in periods(run, now)] == [
        ("total_month", "total_month:2026-12"),
        ("per_job_run", "per_job_run:r3"),
        ("per_trigger_day", "per_trigger_day:trigger:ci:2026-12-02"),
    ]
    # a person who replies in the trigger's thread spends as that person, in that chat
    reply = Who.of("r4", "trigger:ci:abc", Asker("slack", "C1", "U1", False, "trigger:ci:abc"))
    assert (reply.user, reply.channel, reply.job) == ("slack:U1", "slack:C1", "")


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"budgets": {"per_user_day": -1}}, "budgets.per_user_day"),
        ({"budgets": {"unpriced": "maybe"}}, "budgets.unpriced"),
        ({"budgets": {"per_week": 3}}, "budgets.per_week"),
        ({"prices": {"m": {"input": 1}}}, "prices.m.output"),
    ],
)
def test_bad_cost_settings_name_the_key(
    fake_llm: FakeLLM, tmp_path: Path, section: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        agent_config(fake_llm, tmp_path, **section)
    assert key in str(caught.value)


async def test_a_cron_job_reports_the_refusal_as_its_result(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from bot.app import App
    from bot.jobs import Scheduler
    from tests.fakes.llm import ToolCallSpec
    from tests.test_jobs import LEAP, SLACK, T2024, TARGET, FakeChannel

    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("list_directory", {"path": "."})], usage=(2_000, 300))
    )
    jobs = [{"name": "report", "schedule": LEAP, "channel": "slack:C1", "prompt": "Report."}]
    async with running_agent(
        fake_llm,
        tmp_path,
        channels=SLACK,
        jobs=jobs,
        prices=PRICES,
        providers=PROVIDERS,
        budgets={"per_job_run": 0.9},
    ) as agent:
        app = agent.factory
        assert isinstance(app, App)
        channel = FakeChannel()
        sched = Scheduler(app, agent, {"slack": channel})
        try:
            result = await sched.fire(sched.job("report"), T2024)
        finally:
            await sched.shutdown(grace=5)
        [posted] = channel.posts(TARGET)
        assert posted.startswith("Stopped: the per_job_run budget is reached ($0.50 of $0.90")
        assert "It resets at the job's next run" in posted
        assert (result.state, result.delivered) == ("completed", True)
        assert len(fake_llm.requests) == 1


async def test_refusals_and_changes_reach_the_ledgers_hook(tmp_path: Path) -> None:
    """`Ledger.on_event`: where an audit log hooks in (docs/cost.md#budgets)."""
    from core.cost.meter import Ledger
    from core.cost.prices import PriceTable
    from core.cost.settings import BudgetsConfig, ModelPrice
    from core.errors import BudgetExceeded
    from core.store import SqliteStore

    heard: list[tuple[str, dict[str, object]]] = []
    store = await SqliteStore.open(tmp_path / "p.db")
    try:
        ledger = Ledger(
            store,
            PriceTable({"m": ModelPrice(input=1000, output=1000)}),
            BudgetsConfig(total_month=0.1),
            on_event=lambda name, data: heard.append((name, data)),
        )
        meter = ledger.for_run(Who("r1", "c", "slack:U1", "slack:C1", ""), lambda e: None)
        with pytest.raises(BudgetExceeded, match="total_month budget is reached"):
            await meter.reserve("openai_chat", "m", 100, 50)
        await ledger.set_limit("total_month", 1.0, "slack:U9")
        await meter.reserve("openai_chat", "m", 100, 50)  # fits now
    finally:
        await store.aclose()
    assert [name for name, _ in heard] == ["budget.refused", "budget.changed"]
    assert heard[0][1]["budget"] == "total_month"
    assert heard[1][1] == {"budget": "total_month", "from": 0.1, "to": 1.0, "by": "slack:U9"}


async def test_a_compaction_summary_is_metered_as_the_runs_own(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Calls a run makes beside its loop (the summary of a compaction) are priced,
    recorded and held to its budgets like its own; nothing of them reaches its reply."""
    from core.context.manager import ContextManager, ContextSettings
    from core.context.summarize import provider_summarizer
    from core.context.tokens import TokenCounter
    from core.cost.meter import Ledger
    from core.cost.prices import PriceTable
    from core.cost.settings import BudgetsConfig, ModelPrice
    from core.events import LoopEvent, TextDelta
    from core.loop import Guards, run_loop
    from core.run_context import RunContext
    from core.store import SqliteStore
    from tests.conftest import provider_for
    from tests.test_loop_context import executor, long_history

    fake_llm.script(
        Reply(text="SUMMARY: earlier requests were answered.", usage=(900, 20)),
        Reply(text="done", usage=(300, 5)),
    )
    provider = provider_for(fake_llm)
    counter = TokenCounter()
    context = ContextManager(2400, counter, provider_summarizer(provider), ContextSettings())
    store = await SqliteStore.open(tmp_path / "p.db")
    events: list[LoopEvent] = []
    try:
        ledger = Ledger(
            store, PriceTable({"fake-model": ModelPrice(input=1, output=1)}), BudgetsConfig()
        )
        meter = ledger.for_run(Who("r1", "c1", "", "", ""), events.append)
        ctx = RunContext(run_id="r1", conv="c1", sink=events.append, meter=meter)
        outcome = await run_loop(
            long_history(10), provider, executor(), ctx, guards=Guards(context=context)
        )
        await store.flush()
        calls = await store.llm_calls(0)
    finally:
        await store.aclose()
        await provider.aclose()
    assert outcome.text == "done"
    assert [(c.run_id, c.input_tokens, c.cost) for c in calls] == [
        ("r1", 900, 920 / 1e6),
        ("r1", 300, 305 / 1e6),
    ]
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert shown == "done"  # the summary's text never reached the reply
