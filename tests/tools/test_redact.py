"""Secret redaction of tool output (docs/tools.md)."""

from __future__ import annotations

from pathlib import Path

from bot.app import App, build_registry, secret_env_names
from core.redact import Redactor
from tests.agentkit import RecordingResponder, agent_config, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec


def test_known_values_and_token_shapes_are_masked_and_counted() -> None:
    redact = Redactor(["hunter2-is-my-password", "short"])
    text = (
        "pw=hunter2-is-my-password slack=xoxb-1234567890-abcdefghij "
        "openai=sk-abcdefghijklmnopqrstuv tg=123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw "
        "word=short"
    )
    out = redact(text)
    for secret in ("hunter2", "xoxb-", "sk-abc", "AAHdq"):
        assert secret not in out
    assert "word=short" in out  # too short to be treated as a secret
    assert out.endswith("[Parley redacted 4 secrets from this output.]")
    assert redact("nothing here") == "nothing here"


def test_a_secret_upper_cased_or_in_upper_case_hex_is_masked() -> None:
    secret = "k-0123456789abcdef-token"
    redact = Redactor([secret])
    hexed = secret.encode().hex()
    for spelling in (secret.upper(), hexed.upper(), hexed, secret.lower()):
        out = redact(f"out: {spelling} end")
        assert out.startswith("out: [REDACTED] end"), spelling
        assert out.endswith("[Parley redacted 1 secret from this output.]")


async def test_the_model_never_sees_a_secret_a_tool_upper_cases_or_hexes(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """As the finding was made: a tool reads a key from a file and prints it through
    `tr a-z A-Z` and `basenc --base16` (upper-case hex)."""
    secret = "k-0123456789abcdef-token"
    command = "tr a-z A-Z < key.txt; echo; basenc --base16 -w0 key.txt"
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("bash", {"command": command})]), Reply(text="done")
    )
    async with running_agent(
        fake_llm,
        tmp_path,
        environ={"FAKE_KEY": secret},
        providers={"fake": {"api_key_env": "FAKE_KEY"}},
    ) as agent:
        (tmp_path / "workspace").mkdir(exist_ok=True)
        (tmp_path / "workspace" / "key.txt").write_text(secret)
        await agent.submit(inbound("show the key"), RecordingResponder())
        await agent.wait_idle()
    result = fake_llm.requests[-1].json["messages"][-1]["content"]
    assert secret.upper() not in result
    assert secret.encode().hex().upper() not in result
    assert result.count("[REDACTED]") == 2, result
    assert "[Parley redacted 2 secrets from this output.]" in result


def test_secret_env_names_come_from_every_env_key(fake_llm: FakeLLM, tmp_path: Path) -> None:
    config = agent_config(
        fake_llm,
        tmp_path,
        providers={"fake": {"api_key_env": "FAKE_KEY"}},
        channels={"slack": {"enabled": False}},
    )
    names = secret_env_names(config)
    assert {"FAKE_KEY", "SLACK_BOT_TOKEN", "TELEGRAM_BOT_TOKEN", "DISCORD_BOT_TOKEN"} <= names
    assert "OPENAI_MODEL" not in names
    app = App(config, {"FAKE_KEY": "k-0123456789abcdef"}, build_registry(config, {}))
    assert app.redactor("key k-0123456789abcdef").startswith("key [REDACTED]")


async def test_the_model_never_sees_a_secret_printed_by_a_tool(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(
            tool_calls=[
                ToolCallSpec("bash", {"command": "echo token=xoxb-111122223333-abcdefghijkl"})
            ]
        ),
        Reply(text="done"),
    )
    async with running_agent(fake_llm, tmp_path) as agent:
        await agent.submit(inbound("show it"), RecordingResponder())
        await agent.wait_idle()
        result = fake_llm.requests[-1].json["messages"][-1]["content"]
        assert "xoxb-" not in result
        assert "token=[REDACTED]" in result
        assert "[Parley redacted 1 secret from this output.]" in result
        stored = await agent.store.load_messages("test:c1:")
        assert all("xoxb-" not in m.content for m in stored)
