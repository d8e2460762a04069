"""`parley run` with Slack, Discord and Telegram enabled, against the three fakes: one
process answers on each platform, then stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.fakes.discord import DM_CHANNEL_ID, TOKEN, USER, FakeDiscord
from tests.fakes.llm import FakeLLM, RecordedRequest, Reply
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram, TgUser
from tests.process import child_env, fake_llm_config, parley, start_parley, telegram_run_config

ALICE = TgUser(111, "Alice", "alice")
TELEGRAM_TOKEN = "123456:TEST-token"


def _answer(request: RecordedRequest) -> Reply:
    last = request.json["messages"][-1]["content"]
    return Reply(text=f"pong: {last}", chunk_size=3)


async def _wait(condition, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"no answer on {what} within {timeout:g} s") from None


async def test_parley_run_answers_on_all_three_platforms(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.responder = _answer
    async with (
        FakeTelegram(token=TELEGRAM_TOKEN) as telegram,
        FakeSlack() as slack,
        FakeDiscord() as discord,
    ):
        config = tmp_path / "config.toml"
        config.write_text(
            fake_llm_config(
                fake_llm.base_url,
                tmp_path,
                f"""
                [channels.telegram]
                enabled = true
                base_url = "{telegram.url}"
                allow_users = ["{ALICE.id}"]
                [channels.slack]
                enabled = true
                base_url = "{slack.url}"
                allow_users = ["U1"]
                [channels.discord]
                enabled = true
                api_base_url = "{discord.url}"
                gateway_url = "{discord.gateway_url}"
                allow_users = ["{USER.id}"]
                """,
            )
        )
        env = child_env(
            TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN,
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_APP_TOKEN=slack.app_token,
            DISCORD_BOT_TOKEN=TOKEN,
        )
        proc = await start_parley("--config", str(config), "run", env=env, stdin=False)
        assert proc.stderr is not None
        banner = []
        try:
            async with asyncio.timeout(60):
                while True:
                    line = (await proc.stderr.readline()).decode()
                    assert line, "parley run exited early:\n" + "".join(banner)
                    banner.append(line)
                    if "parley: ready" in line:
                        break
            text = "".join(banner)
            assert f"telegram: may talk to it: users {ALICE.id}" in text
            assert "slack: may talk to it: users U1" in text
            assert f"discord: may talk to it: users {USER.id}" in text

            telegram.dm(ALICE, "hello telegram")
            await slack.connected()
            await slack.dm("hello slack")
            await discord.dm("hello discord")

            await _wait(lambda: "pong: hello telegram" in telegram.texts(ALICE.id), "telegram")
            await _wait(
                lambda: any(m.text == "pong: hello slack" for m in slack.live_messages()), "slack"
            )
            await _wait(lambda: "pong: hello discord" in discord.texts(DM_CHANNEL_ID), "discord")
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(proc.stderr.read(), 60)
            await proc.wait()
        assert proc.returncode == 0, rest.decode()
        assert b"parley: stopped" in rest


async def test_jobs_run_fires_one_job_when_another_targets_a_stopped_platform(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="the digest"))
    async with FakeSlack() as slack:
        config = tmp_path / "config.toml"
        config.write_text(
            fake_llm_config(
                fake_llm.base_url,
                tmp_path,
                f"""
                [channels.slack]
                enabled = true
                base_url = "{slack.url}"
                allow_channels = ["C1"]
                [[jobs]]
                name = "digest"
                schedule = "0 9 * * *"
                channel = "slack:C1"
                prompt = "Write the digest."
                [[jobs]]
                name = "elsewhere"
                schedule = "0 9 * * *"
                channel = "discord:7"
                prompt = "Not this one."
                """,
            )
        )
        env = child_env(SLACK_BOT_TOKEN=slack.bot_token, SLACK_APP_TOKEN=slack.app_token)
        code, out, err = await parley("--config", str(config), "jobs", "run", "digest", env=env)
    assert code == 0, err
    assert out.startswith("digest: completed, delivered: yes")
    assert any(m.text == "the digest" for m in slack.live_messages())


async def test_jobs_run_of_a_silent_answer_says_silent_and_succeeds(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="[SILENT]"))
    async with FakeSlack() as slack:
        config = tmp_path / "config.toml"
        config.write_text(
            fake_llm_config(
                fake_llm.base_url,
                tmp_path,
                f"""
                [channels.slack]
                enabled = true
                base_url = "{slack.url}"
                allow_channels = ["C1"]
                [[jobs]]
                name = "quiet"
                schedule = "0 9 * * *"
                channel = "slack:C1"
                prompt = "Say [SILENT] when there is nothing to report."
                """,
            )
        )
        env = child_env(SLACK_BOT_TOKEN=slack.bot_token, SLACK_APP_TOKEN=slack.app_token)
        code, out, err = await parley("--config", str(config), "jobs", "run", "quiet", env=env)
        assert code == 0, (out, err)
        assert out.startswith("quiet: completed, delivered: silent")
        assert not list(slack.live_messages())
        code, listing, _ = await parley("--config", str(config), "jobs", "list", env=env)
    assert code == 0
    assert "silent" in listing


async def test_an_ignored_message_logs_its_reason_at_info_without_its_text(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    mallory = TgUser(666, "Mallory", "mallory")
    async with FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
        config = telegram_run_config(tmp_path, fake_llm.base_url, telegram.url, ALICE.id)
        env = child_env(TELEGRAM_BOT_TOKEN=TELEGRAM_TOKEN)
        proc = await start_parley(
            "--config", str(config), "run", "--log-level", "info", env=env, stdin=False
        )
        assert proc.stderr is not None
        log: list[str] = []
        try:
            async with asyncio.timeout(60):
                while "parley: ready" not in (line := (await proc.stderr.readline()).decode()):
                    assert line, "parley run exited early:\n" + "".join(log)
            telegram.dm(mallory, "secret plans for the heist")
            async with asyncio.timeout(20):
                while "ignoring" not in (line := (await proc.stderr.readline()).decode()):
                    log.append(line)
                log.append(line)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)
    line = log[-1]
    assert "INFO" in line
    assert "not in the allowlists" in line
    assert "heist" not in "".join(log)
    assert not fake_llm.requests


async def test_a_bad_log_level_in_the_environment_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(fake_llm_config("http://127.0.0.1:9", tmp_path))
    code, _out, err = await parley(
        "--config", str(config), "runs", env=child_env(PARLEY_LOG_LEVEL="chatty")
    )
    assert code == 2
    assert "PARLEY_LOG_LEVEL" in err
