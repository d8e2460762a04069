"""Scheduled jobs (docs/jobs.md): cron sessions under the restricted policy, posted to a
target channel, never fired twice, a missed fire run once, failures visible."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.app import App
from bot.jobs import Scheduler, jobs_list, jobs_run
from bot.schedules import build_trigger, latest_fire
from core.agent import Agent
from core.chat import ConversationKey
from core.errors import ConfigError
from tests.agentkit import RecordingResponder, running_agent
from tests.delegatekit import PARENT, Scripts, delegate
from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec

SLACK = {"slack": {"enabled": True, "allow_channels": ["C1"]}}
TARGET: ConversationKey = ("slack", "C1", "")
# Feb 29 at midnight: fire times are injected (2016, 2020, 2024) and the real scheduler,
# started by `start()`, has nothing to fire before 2028.
LEAP = "0 0 29 2 *"
T2024 = datetime(2024, 2, 29, tzinfo=UTC)


class FakeChannel:
    """A `channels.base.Channel` whose conversations are recording responders."""

    def __init__(self, name: str = "slack", *, fail_sends: bool = False) -> None:
        self.name = name
        self.fail_sends = fail_sends
        self.conversations: dict[ConversationKey, RecordingResponder] = {}

    async def start(self, agent: Any) -> None:
        pass

    async def stop(self) -> None:
        pass

    def responder(self, key: ConversationKey) -> RecordingResponder:
        if key not in self.conversations:
            self.conversations[key] = RecordingResponder(fail_sends=self.fail_sends)
        return self.conversations[key]

    def access(self) -> str:
        return "test"

    def posts(self, key: ConversationKey = TARGET) -> list[str]:
        return self.conversations[key].sent if key in self.conversations else []


def job(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "report",
        "schedule": LEAP,
        "channel": "slack:C1",
        "prompt": "Write the status report.",
    }
    spec.update(overrides)
    return spec


@asynccontextmanager
async def scheduler(
    fake_llm: FakeLLM,
    tmp_path: Path,
    jobs: list[dict[str, Any]],
    *,
    channel: FakeChannel | None = None,
    now: datetime | None = None,
    channels: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Scheduler, FakeChannel, Agent]]:
    async with running_agent(fake_llm, tmp_path, channels=channels or SLACK, jobs=jobs) as agent:
        app = agent.factory
        assert isinstance(app, App)
        channel = channel or FakeChannel()
        sched = Scheduler(app, agent, {"slack": channel}, now=(lambda: now) if now else None)
        try:
            yield sched, channel, agent
        finally:
            await sched.shutdown(grace=5)


def tool_results(fake_llm: FakeLLM, request: int) -> list[str]:
    messages = fake_llm.requests[request].json["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


# --- firing and delivery ------------------------------------------------------------------


async def test_job_fires_on_its_schedule_and_posts_to_the_target(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.responder = lambda request: Reply(text="All systems normal.")
    async with scheduler(fake_llm, tmp_path, [job(schedule="* * * * * *")]) as (sched, chan, agent):
        await sched.start()  # the real AsyncIOScheduler, firing every second
        posted = await chan.responder(TARGET).wait_sent("All systems normal.", timeout=15)
        await sched.shutdown()
        assert posted == "All systems normal."
        prompt = fake_llm.requests[0].json["messages"][-1]
        assert prompt == {"role": "user", "content": "Write the status report."}
        runs = await agent.store.job_runs("report", limit=100)
        delivered = [r for r in runs if r["delivered"]]
        assert len(delivered) == len(chan.posts())
        first = runs[-1]
        assert first["state"] == "completed"
        assert first["fire_time"] == int(first["fire_time"])  # the scheduled time, not "now"


async def test_fire_runs_a_cron_session_with_the_jobs_provider(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Report: fine."))
    async with scheduler(fake_llm, tmp_path, [job(provider="other")]) as (sched, chan, agent):
        sched.validate()
        result = await sched.fire(sched.job("report"), T2024)
        assert (result.state, result.delivered, result.ok) == ("completed", True, True)
        assert chan.posts() == ["Report: fine."]
        assert fake_llm.requests[0].json["model"] == "other-model"  # not rebuilt with the default
        # nor built with the default first, to be thrown away
        assert list(sched.app.providers) == ["other"]
        runs = await agent.store.job_runs("report")
        assert runs[0]["fire_time"] == T2024.timestamp()
        assert (runs[0]["delivered"], runs[0]["run_id"]) == (1, result.run_id)
        run = await agent.store.run(result.run_id or "")
        assert run is not None
        assert (run.trigger, run.conv) == ("cron", f"cron:report:{int(T2024.timestamp())}")
        assert not any(key[0] == "cron" for key in agent.lanes)  # the lane was dropped


async def test_jobs_run_fires_now_under_the_same_policy(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "out.txt", "content": "x"})]),
        Reply(text="Could not write."),
    )
    async with scheduler(fake_llm, tmp_path, [job()]) as (sched, chan, agent):
        result = await jobs_run(sched.app, agent, {"slack": chan}, "report")
        assert result.delivered
        assert chan.posts() == ["Could not write."]
        assert "allow_tools" in tool_results(fake_llm, 1)[0]
        with pytest.raises(ConfigError, match="no job named `nope`"):
            await jobs_run(sched.app, agent, {"slack": chan}, "nope")


# --- policy -------------------------------------------------------------------------------


async def test_write_tool_not_in_allow_tools_is_refused_by_policy(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "out.txt", "content": "x"})]),
        Reply(text="I was not allowed to write."),
    )
    async with scheduler(fake_llm, tmp_path, [job(allow_tools=["bash"])]) as (sched, chan, _):
        result = await sched.fire(sched.job("report"), T2024)
        assert result.state == "completed"
        [refusal] = tool_results(fake_llm, 1)
        assert refusal.startswith("error: policy:")
        assert "`write_file` is a write tool" in refusal
        assert "allow_tools" in refusal
        assert not (tmp_path / "workspace" / "out.txt").exists()
        assert chan.posts() == ["I was not allowed to write."]


async def test_a_jobs_child_run_cannot_use_a_tool_the_job_does_not_allow(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    scripts = Scripts()
    fake_llm.responder = scripts
    asked = {"instruction": "alpha: write it", "tools": ["write_file"]}
    scripts.parent.extend(
        [
            Reply(tool_calls=[delegate(asked, call_id="d1")]),
            Reply(tool_calls=[delegate("alpha: write it anyway", call_id="d2")]),
            Reply(text="The job could not write."),
        ]
    )
    write = ToolCallSpec("write_file", {"path": "out.txt", "content": "x"}, id="w1")
    scripts.child("alpha", Reply(tool_calls=[write]), Reply(text="I may not write."))
    async with scheduler(fake_llm, tmp_path, [job(allow_tools=["delegate"])]) as (sched, _, agent):
        result = await sched.fire(sched.job("report"), T2024)
        assert result.state == "completed"
        refused = scripts.tool_results(PARENT, 1)["d1"]
        assert "cannot have `write_file`" in refused
        assert "allow_tools" in refused
        offered = scripts.tools_offered("alpha")
        assert "write_file" not in offered
        assert "bash" not in offered
        assert "read_file" in offered
        assert "unknown tool `write_file`" in scripts.tool_results("alpha")["w1"]
        assert not (tmp_path / "workspace" / "out.txt").exists()
        assert result.run_id is not None
        [child] = await agent.store.child_runs(result.run_id)
        assert child.state == "completed"


async def test_write_tool_listed_in_allow_tools_runs(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "out.txt", "content": "x"})]),
        Reply(text="Written."),
    )
    async with scheduler(fake_llm, tmp_path, [job(allow_tools=["write_file"])]) as (sched, _, _a):
        await sched.fire(sched.job("report"), T2024)
        assert not tool_results(fake_llm, 1)[0].startswith("error")
        assert (tmp_path / "workspace" / "out.txt").read_text() == "x"


async def test_admin_command_is_blocked_without_asking_anyone(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    (tmp_path / "workspace" / "x").mkdir(parents=True)
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": "rm -rf x"})]),
        Reply(text="Blocked."),
    )
    async with scheduler(
        fake_llm, tmp_path, [job(allow_tools=["write_file"])], channel=FakeChannel()
    ) as (sched, chan, _):
        result = await sched.fire(sched.job("report"), T2024)
        [refusal] = tool_results(fake_llm, 1)
        # "policy:" — refused outright; an approval would read "not approved: …".
        assert refusal.startswith("error: policy:")
        assert "admin tool" in refusal
        assert (tmp_path / "workspace" / "x").is_dir()
        assert chan.responder(TARGET).approvals == []
        assert result.text == "Blocked."


# --- restarts -----------------------------------------------------------------------------


async def test_restart_between_fires_does_not_fire_again(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = lambda request: Reply(text="Report.")
    first = FakeChannel()
    async with scheduler(
        fake_llm, tmp_path, [job()], channel=first, now=T2024 + timedelta(seconds=30)
    ) as (sched, _, _a):
        await sched.start()
        await sched.fire(sched.job("report"), T2024)  # what APScheduler would have called
    assert first.posts() == ["Report."]

    second = FakeChannel()
    async with scheduler(
        fake_llm, tmp_path, [job()], channel=second, now=T2024 + timedelta(minutes=10)
    ) as (sched, _, agent):
        await sched.start()
        await sched.wait_idle()
        again = await sched.fire(sched.job("report"), T2024)  # a duplicate trigger
        assert again.state == "skipped"
        assert second.posts() == []
        assert len(await agent.store.job_runs("report", limit=10)) == 1
    assert len(fake_llm.requests) == 1


async def test_fires_missed_while_stopped_run_once(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = lambda request: Reply(text="Report.")
    years = 10 * 366 * 24 * 3600
    jobs = [job(misfire_grace_seconds=years), job(name="fresh", misfire_grace_seconds=years)]
    t2016 = datetime(2016, 2, 29, tzinfo=UTC)
    async with scheduler(fake_llm, tmp_path, jobs) as (sched, chan, _):
        await sched.fire(sched.job("report"), t2016)
    assert chan.posts() == ["Report."]

    # Down through 2020 and 2024: one catch-up, for the latest. `fresh` never fired: none.
    async with scheduler(fake_llm, tmp_path, jobs, now=datetime(2024, 3, 1, tzinfo=UTC)) as (
        sched,
        chan,
        agent,
    ):
        await sched.start()
        await sched.wait_idle()
        assert chan.posts() == ["Report."]
        runs = await agent.store.job_runs("report", limit=10)
        assert [r["fire_time"] for r in runs] == [T2024.timestamp(), t2016.timestamp()]
        assert await agent.store.job_runs("fresh") == []

    async with scheduler(fake_llm, tmp_path, jobs, now=datetime(2024, 3, 2, tzinfo=UTC)) as (
        sched,
        chan,
        _,
    ):
        await sched.start()
        await sched.wait_idle()
        assert chan.posts() == []
    assert len(fake_llm.requests) == 2


async def test_fire_cut_short_by_shutdown_is_recorded_and_not_rerun(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(text="Report."),
        Reply(text="slow " * 200, chunk_size=5, chunk_delay=0.05),  # the catch-up: cut short
    )
    jobs = [job(misfire_grace_seconds=10 * 366 * 24 * 3600)]
    async with scheduler(fake_llm, tmp_path, jobs) as (sched, _, _a):
        await sched.fire(sched.job("report"), datetime(2020, 2, 29, tzinfo=UTC))
    async with scheduler(fake_llm, tmp_path, jobs, now=T2024) as (sched, chan, agent):
        await sched.start()  # the catch-up runs in the background
        await fake_llm.wait_for_requests(2)
        await sched.shutdown(grace=0)
        assert chan.posts() == []
        row = (await agent.store.job_runs("report"))[0]
        assert (row["fire_time"], row["state"], row["delivered"]) == (
            T2024.timestamp(),
            "cancelled",
            0,
        )
    async with scheduler(fake_llm, tmp_path, jobs, now=T2024 + timedelta(minutes=1)) as (
        sched,
        chan,
        _,
    ):
        await sched.start()
        await sched.wait_idle()
        assert chan.posts() == []  # claimed before it ran: never run twice
    assert len(fake_llm.requests) == 2


async def test_missed_fire_beyond_the_grace_is_dropped(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = lambda request: Reply(text="Report.")
    jobs = [job(misfire_grace_seconds=3600)]
    async with scheduler(fake_llm, tmp_path, jobs) as (sched, _, _a):
        await sched.fire(sched.job("report"), datetime(2020, 2, 29, tzinfo=UTC))
    late = T2024 + timedelta(hours=2)
    async with scheduler(fake_llm, tmp_path, jobs, now=late) as (sched, chan, _):
        await sched.start()
        await sched.wait_idle()
        assert chan.posts() == []
    in_grace = T2024 + timedelta(minutes=59)
    async with scheduler(fake_llm, tmp_path, jobs, now=in_grace) as (sched, chan, _):
        await sched.start()
        await sched.wait_idle()
        assert chan.posts() == ["Report."]


# --- failures and `jobs list` -------------------------------------------------------------


async def test_refused_post_is_recorded_as_not_delivered(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="Report."))
    refusing = FakeChannel(fail_sends=True)
    async with scheduler(fake_llm, tmp_path, [job()], channel=refusing) as (sched, _, agent):
        result = await sched.fire(sched.job("report"), T2024)
        assert (result.state, result.delivered, result.ok) == ("completed", False, False)
        assert "refused" in (result.error or "")
        [row] = await agent.store.job_runs("report")
        assert (row["state"], row["delivered"]) == ("completed", 0)
        listing = await jobs_list(sched.app)
    header, line = listing.splitlines()
    assert header.split()[-1] == "delivered"
    assert line.startswith("report")
    assert "2024-02-29 00:00:00 UTC" in line  # last run
    assert "2028-02-29 00:00:00 UTC" in line  # next fire
    assert line.split()[-1] == "no"


async def test_failed_run_posts_a_short_failure_notice(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(fault=Fault(status=400, message="bad request from the fake")))
    async with scheduler(fake_llm, tmp_path, [job()]) as (sched, chan, agent):
        result = await sched.fire(sched.job("report"), T2024)
        assert (result.state, result.delivered) == ("failed", True)
        [notice] = chan.posts()
        assert notice.startswith("⚠ Job `report` failed: ")
        assert "bad request from the fake" in notice
        assert len(notice) < 400
        [row] = await agent.store.job_runs("report")
        assert (row["state"], row["delivered"]) == ("failed", 1)
        assert "bad request from the fake" in row["error"]
        listing = await jobs_list(sched.app, agent.store)
    assert "failed: " in listing.splitlines()[1]
    assert listing.splitlines()[1].split()[-1] == "yes"


async def test_jobs_list_shows_a_job_that_never_ran(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with scheduler(fake_llm, tmp_path, [job(schedule="30 9 * * 1-5")]) as (sched, _, _a):
        listing = await jobs_list(sched.app)
    row = listing.splitlines()[1]
    assert row.startswith("report")
    assert "30 9 * * 1-5" in row
    assert "never" in row


# --- validation ---------------------------------------------------------------------------


async def test_a_target_on_no_platform_is_told_the_platforms_there_are(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with scheduler(fake_llm, tmp_path, [job(channel="irc:#ops")]) as (sched, _, _a):
        with pytest.raises(ConfigError) as caught:
            await sched.start()
    assert caught.value.fix == (
        "write `slack:CHANNEL_ID`, `telegram:CHAT_ID` or `discord:CHANNEL_ID`"
    )


@pytest.mark.parametrize(
    ("jobs", "channels", "key", "words"),
    [
        ([job(schedule="61 * * * *")], SLACK, "jobs.0.schedule", "not a valid cron"),
        ([job(schedule="* * *")], SLACK, "jobs.0.schedule", "3 fields"),
        ([job(schedule="0 9 * * 8")], SLACK, "jobs.0.schedule", "bad weekday"),
        ([job(timezone="Mars/Olympus")], SLACK, "jobs.0.timezone", "unknown timezone"),
        ([job(channel="irc:#ops")], SLACK, "jobs.0.channel", "not a delivery target"),
        ([job(channel="slack")], SLACK, "jobs.0.channel", "not a delivery target"),
        ([job(channel="telegram:42")], SLACK, "jobs.0.channel", "not enabled"),
        ([job(channel="slack:C9")], SLACK, "jobs.0.channel", "allowlist does not admit"),
        (
            [job(name="a"), job(name="b", channel="discord:7")],
            {**SLACK, "discord": {"enabled": True, "open": True}},
            "jobs.1.channel",
            "not running",
        ),
        ([job(), job(channel="slack:C1")], SLACK, "jobs.1.name", "same name"),
    ],
)
async def test_bad_jobs_are_rejected_at_start_naming_job_and_key(
    fake_llm: FakeLLM,
    tmp_path: Path,
    jobs: list[dict[str, Any]],
    channels: dict[str, Any],
    key: str,
    words: str,
) -> None:
    async with scheduler(fake_llm, tmp_path, jobs, channels=channels) as (sched, _, _a):
        with pytest.raises(ConfigError) as caught:
            await sched.start()
    assert caught.value.key == key
    assert words in caught.value.problem
    bad = jobs[int(key.split(".")[1])]["name"]
    assert f"`{bad}`" in caught.value.problem
    assert caught.value.fix


async def test_open_channel_admits_any_target(fake_llm: FakeLLM, tmp_path: Path) -> None:
    channels = {"slack": {"enabled": True, "open": True}}
    async with scheduler(fake_llm, tmp_path, [job(channel="slack:C9")], channels=channels) as (
        sched,
        _,
        _a,
    ):
        sched.validate()


# --- schedules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        # Cron weekdays: 0 and 7 are Sunday, 1-5 Monday to Friday (not APScheduler's 0=Monday).
        ("0 9 * * 1-5", datetime(2024, 3, 2, tzinfo=UTC), datetime(2024, 3, 4, 9, tzinfo=UTC)),
        ("0 9 * * 0", datetime(2024, 3, 4, tzinfo=UTC), datetime(2024, 3, 10, 9, tzinfo=UTC)),
        ("0 9 * * 7", datetime(2024, 3, 4, tzinfo=UTC), datetime(2024, 3, 10, 9, tzinfo=UTC)),
        (
            "*/15 * * * * *",
            datetime(2024, 3, 4, tzinfo=UTC),
            datetime(2024, 3, 4, 0, 0, 15, tzinfo=UTC),
        ),
    ],
)
def test_cron_expressions(schedule: str, after: datetime, expected: datetime) -> None:
    trigger = build_trigger(schedule, UTC)
    assert trigger.get_next_fire_time(None, after + timedelta(microseconds=1)) == expected


def test_latest_fire_is_the_last_scheduled_time_in_the_window() -> None:
    hourly = build_trigger("0 * * * *", UTC)
    now = datetime(2024, 3, 1, 12, 30, tzinfo=UTC)
    assert latest_fire(hourly, datetime(2024, 1, 1, tzinfo=UTC), now) == now.replace(minute=0)
    assert latest_fire(hourly, now.replace(minute=0), now) is None  # strictly after
    assert latest_fire(hourly, now.replace(minute=1), now) is None
