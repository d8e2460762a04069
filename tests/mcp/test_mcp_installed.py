"""Real MCP servers as the docs show them: installed in a virtualenv or an npm folder
outside every root the sandbox reads (their interpreter and installation are made
readable from the command alone); a Node server whose WebAssembly needs gigabytes of
address space, under a memory limit that still holds; an error whose why is only on the
server's stderr; a server that fails to start, as the model sees it; git run by a server
as the tools' user on the operator's repository."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from core.agent import Agent
from core.mcp.install import cache_env, installation
from core.messages import ToolCall
from core.sandbox.jail import SYSTEM_ROOTS
from core.tools.executor import ToolExecutor
from tests.agentkit import RecordingResponder, inbound, running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.mcp.conftest import SERVER
from tests.process import REPO, child_env, fake_llm_config, parley

VENV_BIN = Path(sys.executable).parent  # the project's venv: it has the `mcp` package
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="no `node` on PATH (apt-get install nodejs)")


def _outside_the_roots(path: Path) -> None:
    if any(path.resolve().is_relative_to(root) for root in SYSTEM_ROOTS):
        pytest.skip(f"{path} lies in the system dirs: readable anyway, nothing to prove")


async def call(executor: ToolExecutor, name: str, **args: Any) -> tuple[str, bool]:
    message = await executor.execute(ToolCall(id=name, name=name, arguments=json.dumps(args)))
    return message.content, message.is_error


def executor_of(agent: Agent) -> ToolExecutor:
    executor: ToolExecutor = agent.factory.conversation("fake").executor  # type: ignore[attr-defined]
    return executor


# --- a. the interpreter and the installation are readable ----------------------------------


@pytest.mark.usefixtures("landlock_required")
async def test_the_docs_example_starts_as_written_from_a_venv(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """`command = ["python3", "examples/mcp_notes/server.py"]` with `python3` a venv's
    (a link to a base interpreter under another prefix), no `read_paths`."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtualenv")
    _outside_the_roots(VENV_BIN)
    example = tmp_path / "examples" / "mcp_notes" / "server.py"
    example.parent.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "mcp_notes" / "server.py", example)
    toml = """
        [mcp.servers.notes]
        command = ["python3", "examples/mcp_notes/server.py"]
        env = ["NOTES_AUTHOR"]
        default = "admin"
        [mcp.servers.notes.tools]
        list_notes = "read"
        read_note = "read"
        add_note = "write"
        delete_note = "deny"
    """
    config = tmp_path / "config.toml"
    config.write_text(fake_llm_config(fake_llm.base_url, tmp_path, toml))
    fake_llm.script(
        Reply(tool_calls=[ToolCallSpec("mcp__notes__read_note", {"title": "deploys"}, "r")]),
        Reply(text="no such note"),
    )
    env = child_env(PATH=f"{VENV_BIN}:/usr/bin:/bin", NOTES_AUTHOR="ops-bot")
    code, out, err = await parley("--config", str(config), "chat", "-m", "read it", env=env)
    assert code == 0, err
    assert out.strip() == "no such note", err
    assert fake_llm.requests[-1].json["messages"][-1]["content"] == (
        "There is no note called 'deploys'."
    )


@pytest.mark.usefixtures("landlock_required")
async def test_a_console_script_finds_its_venv_through_its_shebang(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """A program installed as a script whose `#!` names a venv's python (pipx, `pip
    install` into a venv): the script, the venv and the base Python are read."""
    _outside_the_roots(VENV_BIN)
    script = tmp_path / "bin" / "notes-server"
    script.parent.mkdir()
    script.write_text(f"#!{VENV_BIN / 'python'}\n" + SERVER.read_text())
    script.chmod(0o755)
    servers = {"servers": {"notes": {"command": [str(script)], "default": "read"}}}
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        text, failed = await call(executor_of(agent), "mcp__notes__read_note", title="x")
    assert (text, failed) == ("no note called x", False)


def _npm_folder(root: Path) -> Path:
    """`node_server.js` installed as an npm package under `root` (as `npm install` lays
    it out); the `node_modules/.bin` link that runs it."""
    package = root / "node_modules" / "node-mcp"
    (package / "lib").mkdir(parents=True)
    shutil.copy(Path(__file__).with_name("node_server.js"), package / "index.js")
    (package / "index.js").chmod(0o755)
    (package / "lib" / "answer.js").write_text(
        'module.exports = () => "42, from the package\'s own module";\n'
    )
    (package / "package.json").write_text('{"name": "node-mcp", "bin": "index.js"}\n')
    link = root / "node_modules" / ".bin" / "node-mcp"
    link.parent.mkdir()
    link.symlink_to("../node-mcp/index.js")
    return link


@asynccontextmanager
async def node_server(
    fake_llm: FakeLLM, tmp_path: Path, **tools: Any
) -> AsyncIterator[ToolExecutor]:
    assert NODE is not None
    program = _npm_folder(tmp_path / "srv")
    servers = {"servers": {"node": {"command": [str(program)], "default": "read"}}}
    environ = {"PATH": f"{Path(NODE).parent}:/usr/bin:/bin"}
    async with running_agent(
        fake_llm, tmp_path, mcp=servers, environ=environ, tools=tools
    ) as agent:
        yield executor_of(agent)


@needs_node
@pytest.mark.usefixtures("landlock_required")
async def test_a_node_server_in_an_npm_folder_runs_and_its_wasm_fits_the_memory_limit(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Started through its `node_modules/.bin` link; it requires a module of its own
    package, and allocates a WebAssembly memory (V8 reserves ~10 GiB of address space
    for it: more than the default 8 GiB `max_memory_bytes`)."""
    async with node_server(fake_llm, tmp_path) as executor:
        assert await call(executor, "mcp__node__answer") == (
            "42, from the package's own module",
            False,
        )
        assert await call(executor, "mcp__node__wasm") == ("wasm memory of 2097152 bytes", False)


@needs_node
@pytest.mark.usefixtures("landlock_required")
async def test_a_node_servers_memory_is_still_limited(fake_llm: FakeLLM, tmp_path: Path) -> None:
    async with node_server(fake_llm, tmp_path, max_memory_bytes=256 << 20) as executor:
        assert await call(executor, "mcp__node__wasm") == ("wasm memory of 2097152 bytes", False)
        assert await call(executor, "mcp__node__allocate", mb=32) == ("holding 32 MiB", False)
        text, failed = await call(executor, "mcp__node__allocate", mb=512)
    assert failed
    assert "Array buffer allocation failed" in text


def test_npx_from_a_node_install_outside_the_system_dirs_reads_its_prefix(
    tmp_path: Path,
) -> None:
    """An nvm-style install: `bin/npx` links to npm's script in `lib/node_modules`, whose
    `#!/usr/bin/env node` finds `bin/node` on PATH."""
    prefix = tmp_path / "nvm" / "versions" / "node" / "v20"
    npm = prefix / "lib" / "node_modules" / "npm" / "bin"
    npm.mkdir(parents=True)
    (npm / "npx-cli.js").write_text("#!/usr/bin/env node\nrequire('../lib/cli.js')\n")
    (prefix / "bin").mkdir()
    (prefix / "bin" / "node").write_bytes(b"\x7fELF not really")
    (prefix / "bin" / "npx").symlink_to("../lib/node_modules/npm/bin/npx-cli.js")
    for program in (prefix / "bin" / "node", npm / "npx-cli.js"):
        program.chmod(0o755)
    found = installation(
        ["npx", "-y", "@modelcontextprotocol/server-memory"],
        path=f"{prefix / 'bin'}:/usr/bin:/bin",
        cwd=tmp_path,
        system=SYSTEM_ROOTS,
    )
    assert prefix / "lib" / "node_modules" in found  # npm and its dependencies
    assert prefix / "bin" / "node" in found
    assert prefix / "lib" in found  # the node install's own libraries
    assert not any(p in found for p in (tmp_path, prefix, prefix / "bin"))
    assert cache_env(["npx", "-y", "x"], tmp_path / "own") == {
        "npm_config_cache": str(tmp_path / "own" / ".cache" / "npm"),
        "npm_config_update_notifier": "false",
    }


# --- b, c. what the model is told when a server fails --------------------------------------


@needs_node
@pytest.mark.usefixtures("landlock_required")
async def test_a_bare_error_carries_what_the_server_wrote_to_stderr(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    async with node_server(fake_llm, tmp_path) as executor:
        text, failed = await call(executor, "mcp__node__fetch")
    assert failed
    assert text.startswith("error (reported by MCP server `node`): Error executing tool fetch")
    assert text.endswith("fetch failed: getaddrinfo ENOTFOUND example.invalid")


@pytest.mark.usefixtures("landlock_required")
async def test_a_server_that_fails_to_start_is_named_with_its_stderr_until_parked(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """The model calls a tool of a server that never started: it is told that server
    failed and why (the last line of its stderr), not that it misspelt a tool name."""
    command = [sys.executable, "-m", "mcp_server_not_installed"]
    servers = {"servers": {"fetch": {"command": command, "max_restarts": 2}}}
    fetch = ToolCallSpec("mcp__fetch__fetch", {"url": "https://example.com"})
    fake_llm.script(Reply(tool_calls=[fetch]), Reply(text="it is down"))
    fake_llm.script(Reply(tool_calls=[fetch]), Reply(text="still down"))
    chat = RecordingResponder()
    async with running_agent(fake_llm, tmp_path, mcp=servers) as agent:
        await agent.submit(inbound("fetch it"), chat)
        await agent.wait_idle()
        first = fake_llm.requests[-1].json["messages"][-1]["content"]
        connection = agent.factory.mcp.connections["fetch"]  # type: ignore[attr-defined]
        async with asyncio.timeout(20):
            while connection.state != "parked":
                await asyncio.sleep(0.05)
        await agent.submit(inbound("and now?"), chat)
        await agent.wait_idle()
        parked = fake_llm.requests[-1].json["messages"][-1]["content"]
    stderr = "No module named mcp_server_not_installed"
    assert first.startswith("error: MCP server `fetch` failed to start: "), first
    assert stderr in first
    assert "it is being started again" in first
    assert "unknown tool" not in first
    assert parked.startswith("error: MCP server `fetch` failed to start: "), parked
    assert stderr in parked
    assert "parked after 2 failures" in parked


# --- d. git as the tools' user -------------------------------------------------------------


@pytest.fixture
def repository() -> Iterator[Path]:
    """A repository of root's where the tools' user can reach it: git checks every
    parent with access(2), which no capability passes (so not in pytest's 0700 tmp)."""
    place = Path(tempfile.mkdtemp(prefix="parley-repo-"))
    try:
        place.chmod(0o755)
        subprocess.run(["git", "init", "-q", "-b", "main", str(place / "repo")], check=True)
        yield place / "repo"
    finally:
        shutil.rmtree(place)


@pytest.mark.usefixtures("landlock_required")
async def test_git_in_a_server_run_as_nobody_trusts_the_configured_repository(
    fake_llm: FakeLLM, tmp_path: Path, repository: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the server runs as Parley's own user: ownership matches")
    git = {"command": [sys.executable, str(SERVER)], "read_paths": [str(repository)]}
    git["default"] = "read"
    async with running_agent(fake_llm, tmp_path, mcp={"servers": {"git": git}}) as agent:
        call_status = call(executor_of(agent), "mcp__git__git_status", path=str(repository))
        text, failed = await call_status
    assert not failed
    assert "dubious ownership" not in text
    assert text.strip() == "## No commits yet on main"
