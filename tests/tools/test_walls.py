"""The kernel sandbox, tried as an attacker would (docs/tools.md): real processes, real
Landlock, no mocks. Each attack here walked through the text checks before the sandbox.

Under `PARLEY_REQUIRE_SANDBOX=1` (CI) a kernel without Landlock fails these tests instead
of skipping them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from core.messages import ToolCall
from core.sandbox import landlock
from core.sandbox.jail import Jail, count_tasks
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import builtin_tools
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy
from core.tools.running import run_in_workspace
from tests.agentkit import running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.helpers import pids_running
from tests.process import REPO, child_env, start_parley, write_config

pytestmark = pytest.mark.usefixtures("landlock_required")


@pytest.fixture
def secret_home(tmp_path: Path) -> Path:
    """A home with a private key, outside every root the sandbox grants."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-MATERIAL\n")
    return home


@pytest.fixture
def settings(tmp_path: Path, secret_home: Path) -> SandboxSettings:
    shared = tmp_path / "shared"
    (shared / ".ssh").mkdir(parents=True)
    (shared / ".ssh" / "id_rsa").write_text("SHARED-KEY-MATERIAL\n")
    (shared / "notes.txt").write_text("shared notes\n")
    return SandboxSettings(
        workspace=tmp_path / "ws",
        artifacts_dir=tmp_path / "artifacts",
        allowed_paths=[shared],
        denied_paths=[secret_home / ".ssh", shared / ".ssh", Path("/etc/shadow")],
        default_timeout=20,
    )


async def sh(settings: SandboxSettings, command: str, timeout: float = 20) -> str:
    """Run `command` with bash inside the sandbox, bypassing every text check."""
    result = await run_in_workspace(["bash", "-c", command], ToolContext(settings), timeout=timeout)
    return result.text


def bash_executor(settings: SandboxSettings) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(builtin_tools()), ToolPolicy(), ToolContext(settings))


async def bash_tool(settings: SandboxSettings, command: str) -> str:
    call = ToolCall(id="c1", name="bash", arguments=json.dumps({"command": command}))
    return (await bash_executor(settings).execute(call)).content


# --- files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "cat {home}/.ssh/id_rsa",
        "cat {home}/.s?h/id_rsa",
        "cat {home}/.ss''h/id_rsa",
        "cd {home} && cat .ssh/id_rsa",
        "D=.ssh; cat {home}/$D/id_rsa",
        "cat $(printf '%s/.%s' {home} ssh)/id_rsa",
        "ln -s {home}/.ssh/id_rsa key && cat key",
        "ln {home}/.ssh/id_rsa hard && cat hard",
        "cp -r {home}/.ssh copy; cat copy/id_rsa",
        "python3 -c \"print(open('{home}/.ssh/id_rsa').read())\"",
        "cat {shared}/.ssh/id_rsa",
        "cat {shared}/.s?h/*",
        "cd {shared} && cat .ss''h/id_rsa",
        "ln -s {shared}/.ssh s && cat s/id_rsa",
        "find {shared} -type f -exec cat {{}} +",
        "tar cf - -C {shared} . | tar xOf -",
    ],
)
async def test_bash_cannot_read_a_denied_path_however_it_is_spelled(
    settings: SandboxSettings, secret_home: Path, command: str
) -> None:
    shared = settings.allowed_paths[0]
    output = await sh(settings, command.format(home=secret_home, shared=shared))
    assert "KEY-MATERIAL" not in output


async def test_the_rest_of_a_carved_root_stays_usable(settings: SandboxSettings) -> None:
    shared = settings.allowed_paths[0]
    output = await sh(settings, f"cat {shared}/notes.txt && echo more >> {shared}/notes.txt")
    assert "shared notes" in output
    assert (shared / "notes.txt").read_text() == "shared notes\nmore\n"


async def test_bash_cannot_read_parleys_store_events_or_other_artifacts(tmp_path: Path) -> None:
    from bot.app import build_jail
    from bot.config import parse_config

    state = tmp_path / "state"
    (state / "artifacts").mkdir(parents=True)
    for name, text in (
        ("parley.db", "STORE-ROW"),
        ("events.jsonl", "EVENT-LINE"),
        ("artifacts/other.txt", "OTHER-ARTIFACT"),
    ):
        (state / name).write_text(text)
    config = parse_config(
        {
            "default_provider": "p",
            "providers": {"p": {"kind": "openai_chat", "model": "m", "base_url": "http://x"}},
            "tools": {
                "workspace": str(state / "workspace"),
                "artifacts_dir": str(state / "artifacts"),
            },
            "store": {"path": str(state / "parley.db"), "events_log": str(state / "events.jsonl")},
        }
    )
    jail = build_jail(config)
    ctx = ToolContext(config.tools, jail=jail)
    command = "cat ../parley.db ../events.jsonl ../artifacts/*; cat $(ls -d ../*)/* 2>&1"
    result = await run_in_workspace(["bash", "-c", command], ctx, timeout=20)
    for text in ("STORE-ROW", "EVENT-LINE", "OTHER-ARTIFACT"):
        assert text not in result.text
    jail.close()


async def test_bash_cannot_read_the_real_home_or_proc(settings: SandboxSettings) -> None:
    home = Path(os.path.expanduser("~"))
    (home / "private.txt").write_text("HOME-SECRET")
    output = await sh(settings, f"cat {home}/private.txt; ls /proc; cat /proc/1/environ")
    assert "HOME-SECRET" not in output
    assert "Permission denied" in output


@pytest.mark.parametrize(
    "command",
    [
        "echo x > {outside}",
        "cp /etc/hostname {outside}",
        "python3 -c \"open('{outside}', 'w').write('x')\"",
        "mkdir {outside}",
        "ln -s /etc/hostname {outside}",
    ],
)
async def test_bash_cannot_write_outside_its_roots(
    settings: SandboxSettings, tmp_path: Path, command: str
) -> None:
    outside = tmp_path / "outside"
    await sh(settings, command.format(outside=outside))
    assert not outside.exists()
    assert not os.path.lexists(outside)


async def test_bash_writes_in_the_workspace_and_its_temp_dir(settings: SandboxSettings) -> None:
    output = await sh(settings, 'echo hi > made.txt && mktemp && echo "$HOME" && cat made.txt')
    assert "hi" in output
    assert (settings.resolved_workspace() / "made.txt").read_text() == "hi\n"


async def test_a_denied_path_is_refused_before_bash_runs(
    settings: SandboxSettings, secret_home: Path
) -> None:
    # The seatbelt still answers the obvious spelling with a clear reason.
    output = await bash_tool(settings, f"cat {secret_home}/.ssh/id_rsa")
    assert "denied path" in output


# --- Parley's own process ------------------------------------------------------------------

_PROBE = r"""
import asyncio, os, sys
from pathlib import Path
from core.tools.base import ToolContext
from core.sandbox.settings import SandboxSettings
from core.sandbox.landlock import make_undumpable
from core.tools.running import run_in_workspace

import concurrent.futures.thread  # noqa: F401  (imported before the drop: this interpreter
# may live where the user cannot read, e.g. in a 0700 /root)

workspace, become = sys.argv[1], int(sys.argv[2])
if become:
    os.setgroups([])
    os.setresgid(become, become, become)
    os.setresuid(become, become, become)
make_undumpable()
probe = (
    "cat /proc/$PPID/environ; cat /proc/*/environ; tr '\\0' '\\n' < /proc/$PPID/environ;"
    "python3 -c \"import os; print(open('/proc/%d/environ' % os.getppid()).read())\";"
    "cat /proc/$PPID/cmdline; echo done"
)
ctx = ToolContext(SandboxSettings(workspace=workspace, artifacts_dir=workspace + "-art"))
result = asyncio.run(run_in_workspace(["bash", "-c", probe], ctx, timeout=20))
print(result.text)
"""


@pytest.mark.parametrize("user", ["root", "ordinary user"])
async def test_a_tool_gets_none_of_parleys_variables_from_proc(user: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching between root and an ordinary user needs root")
    # Beside the test's tmp_path, whose parents an ordinary user cannot enter.
    holder = tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-probe-")
    base = Path(holder.name)
    os.chmod(base, 0o777)
    become = 65534 if user != "root" else 0
    env = {
        "PATH": os.environ["PATH"],
        "PARLEY_DEPLOY_TOKEN": "tok-9f8e7d6c5b4a",
        "DATABASE_URL": "postgresql://admin:hunter2@db/prod",
        "TMPDIR": str(base),
        "PYTHONPATH": str(REPO),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PROBE, str(base / "ws"), str(become),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    holder.cleanup()
    text = out.decode()
    assert "done" in text, text
    for secret in ("tok-9f8e7d6c5b4a", "hunter2", "PARLEY_DEPLOY_TOKEN"):
        assert secret not in text


async def test_kill_9_of_parley_leaves_no_tool_process(fake_llm: FakeLLM, tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    # Inside the tool's PID namespace `$$` and `$!` mean nothing to the host: each process
    # is found by its command line (the durations are this test's own).
    command = "sleep 300.1 & sleep 300.2"
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": command})]))
    proc = await start_parley(
        "--config", str(config), "chat", env=child_env(OPENAI_BASE_URL=fake_llm.base_url)
    )
    assert proc.stdin is not None
    proc.stdin.write(b"start the job\n")
    await proc.stdin.drain()
    async with asyncio.timeout(30):
        while len(pids := pids_running("sleep", "300.1") + pids_running("sleep", "300.2")) < 2:
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    async with asyncio.timeout(10):
        while any(_alive(pid) for pid in pids):
            await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


async def test_start_up_kills_groups_a_crashed_run_left_in_the_store(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    from core.sandbox.reaper import REAPER, boot_id, start_ticks
    from core.store import open_store

    leftover = await asyncio.create_subprocess_exec("sleep", "300", start_new_session=True)
    db = tmp_path / "parley.db"
    store = await open_store(db)
    store.tool_group_started(leftover.pid, start_ticks(leftover.pid), boot_id())
    store.tool_group_started(999_999, 12345, boot_id())  # long gone: nothing to kill
    await store.flush()
    await store.aclose()
    async with running_agent(fake_llm, tmp_path) as agent:  # the real agent's start-up
        await agent.reconcile()
    assert await asyncio.wait_for(leftover.wait(), 5) == -signal.SIGKILL
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tool_groups").fetchone()[0] == 0
    assert leftover.pid not in REAPER.live


# --- processes -----------------------------------------------------------------------------


async def test_a_fork_bomb_ends_within_its_limit_and_tools_keep_working(tmp_path: Path) -> None:
    settings = SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", max_processes=40
    )
    jail = Jail(settings)
    uid = jail.run_as.uid if jail.run_as else os.getuid()
    before = count_tasks(uid)
    peak = before
    bomb = asyncio.create_task(sh(settings, ":(){ :|:& };:", timeout=4))
    while not bomb.done():
        peak = max(peak, count_tasks(uid))
        await asyncio.sleep(0.05)
    output = bomb.result()
    # However it ends — the timeout, the process limit, or the shell returning while its
    # background children are killed with the group — it ends, and nothing stays behind.
    endings = ("timed out", "Resource temporarily unavailable", "background processes")
    assert any(ending in output for ending in endings), output
    assert peak <= before + 40 + 5  # + a few tasks of other tests' tools in flight
    assert "still here" in await sh(settings, "echo still here")
    async with asyncio.timeout(10):
        while count_tasks(uid) > before + 2:
            await asyncio.sleep(0.1)


async def test_a_tool_cannot_signal_parley(settings: SandboxSettings) -> None:
    if landlock.abi_version() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    # Parley's pid, as an attacker who learnt it would spell it (inside the tool's PID
    # namespace `$PPID` is the namespace's init, not Parley).
    output = await sh(settings, f"kill -STOP {os.getpid()}; echo rc=$?")
    assert "rc=1" in output


async def test_network_false_blocks_tcp(tmp_path: Path) -> None:
    if landlock.abi_version() < 4:
        pytest.skip("network rules need Landlock ABI 4")
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = textwrap.dedent(
        f"""
        python3 -c "
        import socket
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=3); print('connected')
        except OSError as e:
            print('refused', e)
        "
        """
    )
    base = {"workspace": tmp_path / "ws", "artifacts_dir": tmp_path / "art"}
    async with server:
        closed = await sh(SandboxSettings(**base, network=False), probe)
        opened = await sh(SandboxSettings(**base), probe)
    assert "refused" in closed
    assert "connected" in opened


def test_a_writable_root_inside_a_denied_path_is_a_config_error(tmp_path: Path) -> None:
    from core.errors import ConfigError

    settings = SandboxSettings(
        workspace=tmp_path / "secret" / "ws", denied_paths=[tmp_path / "secret"]
    )
    with pytest.raises(ConfigError) as caught:
        Jail(settings)
    assert "tools.workspace" in str(caught.value)
    assert "denied" in str(caught.value)


def test_start_up_says_what_is_enforced(settings: SandboxSettings) -> None:
    line = Jail(settings).describe()
    assert line.startswith(f"sandbox: landlock ABI {landlock.abi_version()}")
    assert "files" in line
    assert "network open" in line
    off = Jail(SandboxSettings(sandbox="off")).describe()
    assert "off" in off
