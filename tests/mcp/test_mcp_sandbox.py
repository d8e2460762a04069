"""A stdio MCP server runs inside the tools' kernel sandbox: a hostile server (its tools
are the attacker's code) tries to read a denied file, `~/.ssh`, a host variable it was
not given and Parley's `/proc/<pid>/environ`, and to write outside its own directory and
temp dir. Each attempt goes through the real path: the model calls the tool, the executor
runs it, the SDK sends it to the sandboxed process."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.messages import ToolCall
from core.tools.executor import ToolExecutor
from tests.agentkit import running_agent
from tests.fakes.llm import FakeLLM
from tests.mcp.conftest import stdio_server

pytestmark = pytest.mark.usefixtures("landlock_required")

TOKEN = "notes-token-0123456789"
OTHER = "other-secret-9876543210"


@pytest.fixture
def secrets_on_disk(tmp_path: Path) -> dict[str, Path]:
    """A private key in Parley's home and a file the configuration denies."""
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-MATERIAL\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "db.txt").write_text("DENIED-FILE-CONTENT\n")
    return {"key": home / ".ssh" / "id_rsa", "denied": tmp_path / "secret" / "db.txt"}


async def call(executor: ToolExecutor, tool: str, **args: Any) -> str:
    message = await executor.execute(
        ToolCall(id=f"c-{tool}", name=f"mcp__notes__{tool}", arguments=json.dumps(args))
    )
    return message.content


@pytest.fixture
async def hostile(fake_llm: FakeLLM, tmp_path: Path) -> AsyncIterator[ToolExecutor]:
    """The executor of a conversation whose `notes` server is the hostile one (write
    category: it may write its own directory)."""
    servers = {"servers": {"notes": stdio_server(default="write", env=["NOTES_TOKEN"])}}
    tools = {"denied_paths": [str(tmp_path / "secret"), "~/.ssh"]}
    environ = {"NOTES_TOKEN": TOKEN, "OTHER_SECRET": OTHER, "PATH": os.environ["PATH"]}
    async with running_agent(
        fake_llm, tmp_path, mcp=servers, tools=tools, environ=environ
    ) as agent:
        yield agent.factory.conversation("fake").executor  # type: ignore[attr-defined]


async def test_a_hostile_server_cannot_read_what_tools_cannot(
    hostile: ToolExecutor, secrets_on_disk: dict[str, Path]
) -> None:
    for path in (secrets_on_disk["key"], secrets_on_disk["denied"]):
        assert (await call(hostile, "probe_read", path=str(path))).startswith("DENIED"), path
    parley = os.getpid()
    for path in (f"/proc/{parley}/environ", "/proc/self/environ", f"/proc/{parley}/cmdline"):
        assert (await call(hostile, "probe_read", path=path)).startswith("DENIED"), path


async def test_a_hostile_server_sees_only_the_variables_it_was_given(
    hostile: ToolExecutor,
) -> None:
    env = await call(hostile, "probe_env")
    names = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    # git's configuration that trusts the server's own repositories (safe.directory)
    names -= {n for n in names if re.fullmatch(r"GIT_CONFIG_(COUNT|KEY_\d+|VALUE_\d+)", n)}
    assert names <= {"PATH", "LANG", "HOME", "TMPDIR", "NOTES_TOKEN", "PWD", "LC_CTYPE"}, names
    assert "OTHER_SECRET" not in env
    assert OTHER not in env
    # Its own variable is there, and masked like every secret in what reaches the model.
    assert "NOTES_TOKEN=" in env
    assert TOKEN not in env


async def test_a_hostile_server_writes_only_its_own_directory_and_temp_dir(
    hostile: ToolExecutor, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    for target in (workspace / "planted.txt", tmp_path / "planted.txt", Path("/tmp/planted-mcp")):
        answer = await call(hostile, "probe_write", path=str(target))
        assert answer.startswith("DENIED"), (target, answer)
        assert not target.exists()
    assert await call(hostile, "probe_write", path="mine.txt") == "WROTE"  # its own directory
    where = await call(hostile, "whoami")
    home = where.split("home=")[1].strip()
    assert await call(hostile, "probe_write", path=f"{home}/scratch.txt") == "WROTE"
    # It is the second process of a PID namespace of its own (its init is the first).
    assert where.startswith("pid=2 ppid=1 ")


async def test_a_read_only_server_cannot_write_even_its_own_directory(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    servers = {"servers": {"notes": stdio_server(default="read")}}
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        executor: ToolExecutor = agent.factory.conversation("fake").executor  # type: ignore[attr-defined]
        assert (await call(executor, "probe_write", path="mine.txt")).startswith("DENIED")
        where = await call(executor, "whoami")
        home = where.split("home=")[1].strip()
        assert await call(executor, "probe_write", path=f"{home}/scratch.txt") == "WROTE"


async def test_without_the_sandbox_the_same_probe_reads_the_key(
    fake_llm: FakeLLM, tmp_path: Path, secrets_on_disk: dict[str, Path]
) -> None:
    """The control: the probe is real, only the wall stops it."""
    servers = {"servers": {"notes": stdio_server(default="write")}}
    tools = {"sandbox": "off"}
    async with running_agent(fake_llm, tmp_path, mcp=servers, tools=tools) as agent:
        executor: ToolExecutor = agent.factory.conversation("fake").executor  # type: ignore[attr-defined]
        answer = await call(executor, "probe_read", path=str(secrets_on_disk["key"]))
    assert answer == "READ: PRIVATE-KEY-MATERIAL\n"
