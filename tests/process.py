"""Running `parley` as a user does: a subprocess with a clean environment, a config file
pointing at the fake LLM, state under the test's temporary directory."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROVIDER_VARS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_MODEL",
    "PARLEY_CONFIG",
)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    """config.toml under tmp_path; the tools of every conversation share the workspace
    `ws` (tests place files there)."""
    path = tmp_path / "config.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            default_provider = "openai"
            [providers.openai]
            kind = "openai_chat"
            base_url = "https://api.openai.com/v1"
            base_url_env = "OPENAI_BASE_URL"
            api_key_env = "OPENAI_API_KEY"
            model = "fake-model"
            max_retries = 1
            [providers.anthropic]
            kind = "anthropic"
            base_url = "https://api.anthropic.com"
            api_key_env = "ANTHROPIC_API_KEY"
            model = "claude"
            [tools]
            workspace = "{tmp_path / "ws"}"
            workspace_scope = "shared"
            artifacts_dir = "{tmp_path / "artifacts"}"
            tools_file = "tools.yaml"
            [store]
            path = "{tmp_path / "parley.db"}"
            events_log = "{tmp_path / "events.jsonl"}"
            """
        )
        + extra
    )
    return path


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_VARS}
    env.update(extra)
    return env


async def start_parley(
    *args: str, env: dict[str, str], stdin: bool = True, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """`python -m bot ARGS` with piped stdout/stderr (and stdin unless told otherwise)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd or REPO,
    )


async def parley(
    *args: str, env: dict[str, str], stdin: bytes | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    proc = await start_parley(*args, env=env, stdin=stdin is not None, cwd=cwd)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def fake_llm_config(base_url: str, state: Path, extra: str = "", *, store: str = "") -> str:
    """config.toml text whose one provider is the fake LLM at `base_url`, with the store,
    events log, workspace and artifacts under `state`; `extra` TOML is appended. `store`:
    TOML lines that say where the store is instead (a PostgreSQL `url`, its settings)."""
    where = store or f'path = "{state / "parley.db"}"'
    return (
        textwrap.dedent(
            f"""
            default_provider = "fake"
            [providers.fake]
            kind = "openai_chat"
            base_url = "{base_url}"
            model = "fake-model"
            [tools]
            workspace = "{state / "ws"}"
            workspace_scope = "shared"
            artifacts_dir = "{state / "artifacts"}"
            tools_file = ""
            [store]
            events_log = "{state / "events.jsonl"}"
            """
        )
        + f"{where}\n"
        + textwrap.dedent(extra)
    )


def _channel_run_config(
    tmp_path: Path, llm_url: str, platform: str, base_url: str, user: str, extra: str
) -> Path:
    """config.toml for `parley run` with the fake LLM and a fake `platform` at `base_url`,
    admitting `user`; `extra` TOML goes inside [channels.<platform>] (then any further
    sections)."""
    config = tmp_path / "config.toml"
    section = f"""
        [channels.{platform}]
        enabled = true
        base_url = "{base_url}"
        allow_users = ["{user}"]
        """
    config.write_text(
        fake_llm_config(llm_url, tmp_path, textwrap.dedent(section) + textwrap.dedent(extra))
    )
    return config


def slack_run_config(
    tmp_path: Path, llm_url: str, slack: Any, extra: str = "", secret: str = "signing-secret"
) -> tuple[Path, dict[str, str]]:
    """config.toml for `parley run` with the fake LLM and the fake Slack `slack`, admitting
    U1 (`extra` TOML goes inside [channels.slack]), and the environment with its tokens."""
    config = _channel_run_config(tmp_path, llm_url, "slack", slack.url, "U1", extra)
    env = child_env(
        SLACK_BOT_TOKEN=slack.bot_token,
        SLACK_APP_TOKEN=slack.app_token,
        SLACK_SIGNING_SECRET=secret,
    )
    return config, env


def telegram_run_config(
    tmp_path: Path, llm_url: str, telegram_url: str, user_id: int, extra: str = ""
) -> Path:
    """`_channel_run_config` for the fake Telegram at `telegram_url`, admitting `user_id`."""
    return _channel_run_config(tmp_path, llm_url, "telegram", telegram_url, str(user_id), extra)
