"""Reloading the configuration (docs/operations.md#reloading): applied between turns, never
mid-turn; a file
that does not validate keeps the running configuration."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from bot.app import App, build_registry
from bot.config import load_config
from core.errors import ConfigError
from tests.agentkit import RecordingResponder, inbound
from tests.fakes.llm import FakeLLM, Reply
from tests.process import child_env, fake_llm_config, start_parley


def write(path: Path, fake_llm: FakeLLM, prompt: str) -> None:
    extra = f'[agent]\nsystem_prompt = "{prompt}"\n'
    path.write_text(fake_llm_config(fake_llm.base_url, path.parent, extra))


def system_prompt(fake_llm: FakeLLM) -> str:
    content = fake_llm.requests[-1].json["messages"][0]["content"]
    assert isinstance(content, str)
    return content


async def test_reload_applies_from_the_next_turn_and_keeps_the_history(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    path = tmp_path / "config.toml"
    write(path, fake_llm, "You are the old bot.")
    fake_llm.script(Reply(text="slow " * 60, chunk_size=5, chunk_delay=0.02), Reply(text="new"))
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    agent = await app.open_agent()
    try:
        chat = RecordingResponder()
        await agent.submit(inbound("first"), chat)
        await fake_llm.wait_for_requests(1)
        write(path, fake_llm, "You are the new bot.")
        assert app.reload() == "configuration reloaded (generation 1)"
        await agent.wait_idle()  # the running turn finished on the old configuration
        assert system_prompt(fake_llm).startswith("You are the old bot.")
        await agent.submit(inbound("second"), chat)
        await agent.wait_idle()
        assert system_prompt(fake_llm).startswith("You are the new bot.")
        users = [
            m["content"] for m in fake_llm.requests[-1].json["messages"] if m["role"] == "user"
        ]
        assert users == ["first", "second"]
    finally:
        await app.close_agent(agent)
        await app.aclose()


async def test_a_broken_file_keeps_the_running_configuration(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    path = tmp_path / "config.toml"
    write(path, fake_llm, "You are the old bot.")
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    path.write_text(path.read_text() + "\n[agent]\nmax_iterations = 0\n")  # [agent] twice
    with pytest.raises(ConfigError):
        app.reload()
    assert app.config is config
    assert app.generation == 0


async def test_a_problem_found_on_reload_names_the_file_it_is_in(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A file that validates but names no user of this machine: the error names the file
    read (not `config.toml`), and the running configuration stays."""
    path = tmp_path / "other.toml"
    write(path, fake_llm, "You are the old bot.")
    config = load_config(path)
    app = App(config, {}, build_registry(config, {}))
    path.write_text(path.read_text().replace("[tools]\n", '[tools]\nrun_as = "no-such-p38"\n'))
    with pytest.raises(ConfigError) as caught:
        app.reload()
    assert str(caught.value).startswith(f"{path}: `tools.run_as`: no user `no-such-p38`")
    assert app.config is config


async def test_sighup_reloads_parley_run(fake_llm: FakeLLM, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    write(path, fake_llm, "You are the old bot.")
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    env = child_env()
    proc = await start_parley("--config", str(path), "run", "--console", env=env)
    assert proc.stdin is not None
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while b"parley: ready" not in await proc.stderr.readline():
                pass
        proc.stdin.write(b"hello\n")
        await proc.stdin.drain()
        await fake_llm.wait_for_requests(1, timeout=15)
        write(path, fake_llm, "You are the new bot.")
        proc.send_signal(signal.SIGHUP)
        async with asyncio.timeout(30):
            while b"configuration reloaded" not in await proc.stderr.readline():
                pass
        proc.stdin.write(b"again\n/exit\n")
        await proc.stdin.drain()
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert system_prompt(fake_llm).startswith("You are the new bot.")
