"""`parley` as a user runs it: a subprocess against the fake LLM over real HTTP."""

from __future__ import annotations

import ast
import asyncio
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, Fault, Reply, ToolCallSpec
from tests.process import REPO, child_env, parley, start_parley, write_config


async def test_chat_m_runs_a_multi_tool_turn_end_to_end(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(
            text="Writing it.",
            tool_calls=[
                ToolCallSpec("write_file", {"path": "note.txt", "content": "hello from the tool"})
            ],
        ),
        Reply(
            tool_calls=[
                ToolCallSpec("bash", {"command": "cat note.txt && echo $OPENAI_API_KEY"}),
                ToolCallSpec("list_directory", {"path": "."}),
            ]
        ),
        Reply(text="The note says: hello from the tool."),
    )
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url, OPENAI_API_KEY="sk-secret-test-key")
    code, out, err = await parley("--config", str(config), "chat", "-m", "read the note", env=env)
    assert code == 0, err
    # Only what the model says is on stdout (its words before a tool call stream too).
    assert out == "Writing it.\nThe note says: hello from the tool.\n"
    assert "→ write_file" in err
    assert "→ bash" in err
    assert "→ list_directory" in err
    third = fake_llm.requests[2].json["messages"]
    results = [m["content"] for m in third if m["role"] == "tool"]
    assert "hello from the tool" in results[1]
    assert "sk-secret-test-key" not in results[1]  # the key never reaches the tool's env
    assert "note.txt" in results[2]
    assert fake_llm.requests[0].headers["authorization"] == "Bearer sk-secret-test-key"
    fake_llm.assert_complete()


async def test_chat_m_writes_each_message_into_a_pipe_once_its_stream_is_done(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A pipe cannot take back a failed attempt's text (docs/channels.md#terminal): the
    text the model says before a tool call is there before the tool runs, the answer once
    its stream is done — each whole, never a partial message."""
    fake_llm.script(
        Reply(text="Let me look.", tool_calls=[ToolCallSpec("bash", {"command": "sleep 2"})]),
        Reply(text="first second third fourth fifth.", chunk_size=6, chunk_delay=0.1),
    )
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    proc = await start_parley("--config", str(config), "chat", "-m", "count", env=env, stdin=False)
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 15)
    assert first == b"Let me look.\n"  # while the tool still runs
    assert len(fake_llm.requests) == 1
    rest = await asyncio.wait_for(proc.stdout.read(), 15)
    assert await proc.wait() == 0
    assert rest == b"first second third fourth fifth.\n"


async def test_config_from_parley_config_env(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="configured by env"))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url, PARLEY_CONFIG=str(config))
    code, out, err = await parley("chat", "-m", "hi", env=env)
    assert (code, out) == (0, "configured by env\n"), err


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ('[agent]\nmax_iterations = "many"\n', "agent.max_iterations", "valid integer"),
        ("[agent]\nmax_iteration = 3\n", "agent.max_iteration", "remove it"),
        (
            '[providers.bad]\nkind = "grpc"\nmodel = "m"\nbase_url = "x"\n',
            "providers.bad.kind",
            "openai_chat",
        ),
        ("default_provider = [\n", "(syntax)", "TOML"),
    ],
)
async def test_bad_config_names_key_and_fix_without_traceback(
    tmp_path: Path, extra: str, key: str, words: str
) -> None:
    config = write_config(tmp_path, extra)
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=child_env())
    assert code == 2
    assert key in err
    assert words in err
    assert "fix:" in err
    assert "Traceback" not in err
    assert out == ""


async def test_unknown_default_provider_is_a_config_error(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace('default_provider = "openai"', 'default_provider = "nope"')
    )
    code, _, err = await parley("--config", str(config), "chat", "-m", "hi", env=child_env())
    assert code == 2
    assert "default_provider" in err
    assert "nope" in err
    assert "openai" in err


async def test_missing_config_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    code, _, err = await parley(
        "--config", str(tmp_path / "nope.toml"), "chat", "-m", "x", env=child_env()
    )
    assert code == 2
    assert "does not exist" in err
    assert "PARLEY_CONFIG" in err


async def test_no_provider_reachable_says_what_to_set(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=child_env())
    assert code == 2
    assert out == ""
    assert "OPENAI_API_KEY is not set" in err
    assert "ANTHROPIC_API_KEY is not set" in err
    assert "OPENAI_BASE_URL" in err
    assert f"(see {config})" in err  # the file given, whatever its name
    assert "Traceback" not in err


async def test_shipped_config_and_tools_load(tmp_path: Path) -> None:
    """The repo's own config.toml and tools.yaml are valid; with no keys it exits 2 and
    names the variables (what `make run` shows a newcomer)."""
    code, _, err = await parley(
        "--config", str(REPO / "config.toml"), "chat", "-m", "hi", env=child_env(HOME=str(tmp_path))
    )
    assert code == 2
    assert "OPENAI_API_KEY" in err
    assert "ANTHROPIC_API_KEY" in err
    assert "configuration problem" not in err


async def test_falls_back_to_next_usable_provider(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="from anthropic"))
    config = write_config(tmp_path)
    config.write_text(
        config.read_text().replace(
            'base_url = "https://api.anthropic.com"', f'base_url = "{fake_llm.root_url}"'
        )
    )
    env = child_env(ANTHROPIC_API_KEY="k")
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert (code, out) == (0, "from anthropic\n"), err
    assert "using provider `anthropic`" in err


async def test_provider_error_exits_1_with_message(fake_llm: FakeLLM, tmp_path: Path) -> None:
    from tests.fakes.llm import Fault

    fake_llm.script(Reply(fault=Fault(status=401, message="invalid api key")))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url, OPENAI_API_KEY="wrong")
    code, out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 1
    assert out == ""
    assert "invalid api key" in err
    assert "Traceback" not in err


async def test_interactive_ctrl_c_cancels_turn_not_program(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.script(
        Reply(text="word " * 400, chunk_size=4, chunk_delay=0.02),
        Reply(text="second answer"),
    )
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    proc = await start_parley("--config", str(config), "chat", env=env)
    assert proc.stdin
    assert proc.stdout
    assert proc.stderr
    proc.stdin.write(b"tell me a long story\n")
    await proc.stdin.drain()
    first = await asyncio.wait_for(proc.stdout.read(10), 15)  # streaming has started
    assert first.startswith(b"word")
    proc.send_signal(signal.SIGINT)
    await fake_llm.wait_for_disconnects(1, timeout=5)
    proc.stdin.write(b"and now?\n/exit\n")
    await proc.stdin.drain()
    out, _err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0
    assert b"Stopped." in out
    assert b"second answer" in out
    # The cancelled turn left a valid history: the second request was accepted by the fake,
    # which rejects malformed transcripts, and holds both user messages.
    users = [m["content"] for m in fake_llm.requests[1].json["messages"] if m["role"] == "user"]
    assert users == ["tell me a long story", "and now?"]


def test_version_imports_no_platform_sdk_or_http_stack() -> None:
    """`parley --version` must start fast: no SDK, httpx or pydantic import on that path."""
    code = (
        "import sys\n"
        "from bot.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('discord', 'slack_bolt', 'telegram', 'httpx', 'httpx2', 'pydantic',"
        " 'tiktoken', 'aiosqlite', 'apscheduler') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"
    assert result.stdout.startswith("parley ")


async def _python(code: str, env: dict[str, str], stdin: bytes = b"") -> list[str]:
    """The lines a whole `python -c code` process run from the repository printed; it
    must exit 0."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode().splitlines()


async def _loaded_by_one_shot(
    fake_llm: FakeLLM, tmp_path: Path, modules: tuple[str, ...]
) -> list[str]:
    """Which of `modules` a whole `parley chat -m` process (one turn, no tool call) has
    imported by its end."""
    fake_llm.script(Reply(text="no commands needed"))
    config = write_config(tmp_path)
    code = (
        "import sys\n"
        "from bot.cli import main\n"
        f"status = main(['--config', {str(config)!r}, 'chat', '-m', 'hi'])\n"
        f"print(sorted(m for m in {modules!r} if m in sys.modules))\n"
        "sys.exit(status)\n"
    )
    lines = await _python(code, child_env(OPENAI_BASE_URL=fake_llm.base_url))
    assert "no commands needed" in lines[0]
    loaded: list[str] = ast.literal_eval(lines[-1])
    return loaded


async def test_a_turn_without_commands_loads_no_command_parser(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`bash`'s seatbelt (tree-sitter, ~30 ms to import) loads at the first `bash` call, so
    a one-shot turn that runs no command starts without it."""
    assert await _loaded_by_one_shot(fake_llm, tmp_path, ("tree_sitter", "tree_sitter_bash")) == []


ONE_SHOT_NEVER_LOADS = (
    # the platform SDKs and the scheduler: the one-shot turn has no channel and no job
    "slack_bolt",
    "slack_sdk",
    "discord",
    "telegram",
    "apscheduler",
    # the store: the one-shot turn is stateless (docs/benchmarks.md)
    "aiosqlite",
    "sqlite3",
    "core.store.sqlite",
    "core.store.protocol",
    "core.store.rows",
    "core.eventlog",
    # the durable agent around conversations: lanes, runs, workers, commands, recovery
    "core.agent.agent",
    "core.agent.lane",
    "core.agent.turn",
    "core.agent.workers",
    "core.agent.commands",
    "core.agent.recovery",
    # sections the file leaves out are built when first read (core.sections), and the
    # one-shot turn reads none of these: roles, MCP servers, prices and budgets, the
    # operator's settings, the chat platforms' settings (docs/benchmarks.md)
    "core.roles",
    "core.mcp.config",
    "core.cost.settings",
    "core.cost.meter",
    "core.store.usage_rows",
    "bot.ops_config",
    "channels.platforms",
    "channels.gate",
    "channels.slack_config",
    "channels.telegram_config",
    "channels.discord_config",
    # what only a fetch, or a platform's lease, uses
    "core.sandbox.webnet",
    "core.lease",
    # what the one-shot turn is not offered: it has no agent to delegate to and no store
    # to remember in (`build_registry(stateless=True)`)
    "core.tools.delegate",
    "core.tools.delegation",
    "core.memory.tools",
    "core.memory.service",
    "core.store.memory_rows",
    # the context strategies' trackers: only their strategy loads them
    "core.context.focus",
    "core.context.subgoals",
    # the network supervisor: only a configuration that supervises sockets starts it
    "core.sandbox.netcall",
    "core.sandbox.netsupervisor",
    "core.sandbox.netsend",
)


async def test_a_one_shot_turn_loads_no_store_agent_or_channel_sdk(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`parley chat -m` starts as fast as its libraries allow: each of these is imported by
    what needs it (opening a store, `parley run`, a channel), not by the one-shot path.
    A module that shows up here is an eager import that came back."""
    assert await _loaded_by_one_shot(fake_llm, tmp_path, ONE_SHOT_NEVER_LOADS) == []


async def test_a_one_shot_turn_is_not_offered_tools_it_cannot_use(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`parley chat -m` has no agent and no store: `delegate` (child runs are the agent's)
    and `remember`/`recall` (memory lives in the store) could only refuse there, so the
    model is not offered them. `parley run`, in the same configuration, offers them."""
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    config = write_config(tmp_path, "[memory]\nenabled = true\n[agent]\nmax_depth = 1\n")
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, err = await parley("--config", str(config), "chat", "-m", "hi", env=env)
    assert code == 0, err
    code, _out, err = await parley("--config", str(config), "run", env=env, stdin=b"hi\n/exit\n")
    assert code == 0, err
    one_shot, served = ({t["function"]["name"] for t in r.json["tools"]} for r in fake_llm.requests)
    stateful = {"delegate", "remember", "recall"}
    assert served >= stateful | {"read_file", "bash"}
    assert one_shot == served - stateful


async def _collector_at_exit(config: Path, env: dict[str, str], *args: str, stdin: bytes) -> str:
    """What a whole `parley` process (the `entry` point, as the installed command runs it)
    says of the garbage collector as it exits: running, and the start-up heap frozen."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('collector:', gc.isenabled(), gc.get_freeze_count() > 0))\n"
        f"sys.argv = ['parley', '--config', {str(config)!r}, *{args!r}]\n"
        "from bot.cli import entry\n"
        "entry()\n"
    )
    return (await _python(code, env, stdin))[-1]


async def test_the_collector_paused_for_start_up_runs_again_for_the_turn(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`entry` pauses the garbage collector while Parley starts (docs/benchmarks.md); the
    one-shot turn and a `parley run` that is ready have it back, with what start-up made
    frozen out of its passes. A process left without a collector would grow without
    bound on cyclic garbage."""
    fake_llm.script(Reply(text="one"), Reply(text="two"))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    one_shot = await _collector_at_exit(config, env, "chat", "-m", "hi", stdin=b"")
    assert one_shot == "collector: True True"
    served = await _collector_at_exit(config, env, "run", stdin=b"hi\n/exit\n")
    assert served == "collector: True True"
    assert len(fake_llm.requests) == 2  # both processes took their turn


async def test_run_without_channels_talks_in_the_console(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Reply(text="hello from run"))
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley(
        "--config", str(config), "run", env=env, stdin=b"hi\n/status\n/exit\n"
    )
    assert code == 0, err
    assert "no channel is enabled" in err
    assert "console: may talk to it: whoever types at this terminal" in err
    assert "hello from run" in out
    assert "Provider: openai (fake-model)" in out
    assert "parley: stopped" in err


async def test_run_refuses_a_bad_job_naming_it_and_the_key(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        textwrap.dedent(
            """
            [[jobs]]
            name = "digest"
            schedule = "0 9 * *"
            channel = "console:local"
            prompt = "hi"
            """
        ),
    )
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, err = await parley("--config", str(config), "run", env=env, stdin=b"")
    assert code == 2
    assert "jobs.0.schedule" in err
    assert "digest" in err
    assert "Traceback" not in err


async def test_run_with_a_missing_channel_token_names_the_variable(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    config = write_config(tmp_path, '\n[channels.slack]\nenabled = true\nallow_users = ["U1"]\n')
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, err = await parley("--config", str(config), "run", env=env, stdin=b"")
    assert code == 2
    assert "SLACK_BOT_TOKEN" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("command", "edit", "key"),
    [
        # found while reading the file (the schema)
        (("chat", "-m", "hi"), ("", "[agent]\nmax_iterations = 0\n"), "agent.max_iterations"),
        # found while building the application (no such user on this machine)
        (
            ("chat", "-m", "hi"),
            ("[tools]\n", '[tools]\nrun_as = "no-such-user-p38"\n'),
            "tools.run_as",
        ),
        # found while starting a channel (its token's variable is not set)
        (
            ("run",),
            ("", '[channels.slack]\nenabled = true\nallow_users = ["U1"]\n'),
            "channels.slack",
        ),
        # found by a command (no such job)
        (("jobs", "runs", "nightly"), ("", ""), "`jobs`"),
    ],
    ids=["schema", "build", "start-up", "command"],
)
async def test_a_config_problem_names_the_file_given_to_config(
    fake_llm: FakeLLM, tmp_path: Path, command: tuple[str, ...], edit: tuple[str, str], key: str
) -> None:
    """`--config other.toml`: every configuration problem says `other.toml:`, wherever
    it is found, never `config.toml:`."""
    written = write_config(tmp_path)
    config = written.rename(tmp_path / "other.toml")
    old, new = edit
    text = config.read_text()
    config.write_text(text.replace(old, new, 1) if old else text + new)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, _out, err = await parley("--config", str(config), *command, env=env, stdin=b"")
    assert code == 2, err
    assert f"configuration problem\n{config}: " in err
    assert key in err.split(f"{config}: ", 1)[1].splitlines()[0]
    assert "config.toml:" not in err
    assert "Traceback" not in err


async def test_chat_m_stdout_is_only_the_answer_when_a_cut_stream_is_retried(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A provider stream cut mid-answer is retried: the retry notice goes to stderr and
    nothing of the failed attempt (no line break either) stays in stdout."""
    answer = "alpha beta gamma delta epsilon."
    fake_llm.script(
        Reply(text=answer, chunk_size=5, fault=Fault(cut_after=3)),
        Reply(text=answer, chunk_size=5),
    )
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    code, out, err = await parley("--config", str(config), "chat", "-m", "go", env=env)
    assert code == 0, err
    assert "retry" in err
    assert out == answer + "\n"


@pytest.mark.parametrize("into", ["pipe", "file"])
async def test_chat_m_stdout_holds_only_the_retry_when_it_says_something_else(
    fake_llm: FakeLLM, tmp_path: Path, into: str
) -> None:
    """The retry of a cut stream answers differently (as a real model does): into a pipe
    each message is written once its stream is done, into a file the failed attempt's text
    is rewritten; either way stdout is exactly the answer that stood."""
    fake_llm.script(
        Reply(text="first try that breaks off here", chunk_size=5, fault=Fault(cut_after=3)),
        Reply(text="second, different answer.", chunk_size=5),
    )
    config = write_config(tmp_path)
    env = child_env(OPENAI_BASE_URL=fake_llm.base_url)
    if into == "pipe":
        code, out, err = await parley("--config", str(config), "chat", "-m", "go", env=env)
    else:
        answer = tmp_path / "answer.txt"
        with answer.open("w") as sink:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(config), "chat", "-m", "go",
                stdout=sink, stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
            )  # fmt: skip
            _, raw_err = await asyncio.wait_for(proc.communicate(), 60)
        code, out, err = proc.returncode, answer.read_text(), raw_err.decode()
    assert code == 0, err
    assert "retry" in err
    assert out == "second, different answer.\n"
