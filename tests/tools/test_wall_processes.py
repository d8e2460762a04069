"""No tool process outlives its call, tried as an attacker would: `setsid`, double forks,
`nohup … & disown` and daemons, through the tools' process path (`run_in_workspace`, past
every text check) and a real Parley's `bash` tool (from a script file, which no text
check reads), ended normally, by the timeout, by cancellation (/stop), by `kill -9` of
Parley and by the start-up ledger after a crash of Parley and its reaper.

Each escape first proves it is running (it writes `up`), and the command waits for that:
the test cannot pass because the escape had not started yet. Processes are found by their
command line (`sleep <marker>`): inside a tool's PID namespace `$$` and `$!` are the
namespace's own numbers."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest

from core.errors import ToolError
from core.sandbox.jail import Jail
from core.sandbox.settings import SandboxSettings
from core.tools.base import ToolContext, ToolResult
from core.tools.running import run_in_workspace
from tests.agentkit import running_agent
from tests.fakes.llm import FakeLLM, Reply, ToolCallSpec
from tests.helpers import pids_running, wait_dead
from tests.process import REPO, child_env, start_parley, write_config

pytestmark = pytest.mark.usefixtures("landlock_required")


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", default_timeout=20
    )


_counter = iter(range(1, 10_000))


def marker() -> str:
    """A `sleep` argument no other test uses: this process's pid and a counter."""
    return f"{4000 + os.getpid() % 1000}.{next(_counter)}"


# Each starts `sleep {m}` outside the tool's process group (or under a new parent), and
# writes `up` once the sleeper runs; `{wait}` then waits for it.
ESCAPES = {
    "setsid -f": "setsid -f sh -c 'echo > up; exec sleep {m}' >/dev/null 2>&1",
    "double fork": "( ( sh -c 'echo > up; exec sleep {m}' >/dev/null 2>&1 & ) & )",
    "nohup and disown": "nohup sh -c 'echo > up; exec sleep {m}' >/dev/null 2>&1 & disown",
    "daemon": (
        'python3 -c "import os\n'
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(1); os.close(2); open('up', 'w').close()\n"
        "        os.execvp('sleep', ['sleep', '{m}'])\""
    ),
}
WAIT = "until [ -e up ]; do sleep 0.01; done"


def escape(kind: str, m: str) -> str:
    return f"{ESCAPES[kind].format(m=m)}; {WAIT}"


async def sh(settings: SandboxSettings, command: str, timeout: float = 20) -> ToolResult:
    """`bash -c command` as the `bash` tool runs it, without the text checks."""
    return await run_in_workspace(["bash", "-c", command], ToolContext(settings), timeout=timeout)


async def sleepers(m: str, within: float = 10) -> list[int]:
    async with asyncio.timeout(within):
        while not (pids := pids_running("sleep", m)):
            await asyncio.sleep(0.02)
    return pids


# --- the call ends -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(ESCAPES))
async def test_an_escaped_process_dies_when_the_call_ends(
    settings: SandboxSettings, kind: str
) -> None:
    m = marker()
    result = await sh(settings, escape(kind, m) + "; echo started")
    assert "started" in result.text, result.text
    assert wait_dead(pids_running("sleep", m)) == []
    assert pids_running("sleep", m) == []


@pytest.mark.parametrize("kind", ["setsid -f", "daemon"])
async def test_an_escaped_process_dies_when_the_call_times_out(
    settings: SandboxSettings, kind: str
) -> None:
    m = marker()
    task = asyncio.create_task(sh(settings, escape(kind, m) + "; sleep 60", timeout=1))
    pids = await sleepers(m)
    result = await task
    assert "timed out" in result.text
    assert wait_dead(pids) == []


@pytest.mark.parametrize("kind", ["setsid -f", "double fork"])
async def test_an_escaped_process_dies_when_the_call_is_cancelled(
    settings: SandboxSettings, kind: str
) -> None:
    m = marker()
    task = asyncio.create_task(sh(settings, escape(kind, m) + "; sleep 60"))
    pids = await sleepers(m)
    task.cancel()  # what /stop does to the run's task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_dead(pids) == []


# --- Parley dies ---------------------------------------------------------------------------


async def _parley_running(
    fake_llm: FakeLLM, tmp_path: Path, command: str
) -> asyncio.subprocess.Process:
    config = write_config(tmp_path)
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    fake_llm.script(Reply(tool_calls=[ToolCallSpec("bash", {"command": command})]))
    proc = await start_parley(
        "--config", str(config), "chat", env=child_env(OPENAI_BASE_URL=fake_llm.base_url)
    )
    assert proc.stdin is not None
    proc.stdin.write(b"start the job\n")
    await proc.stdin.drain()
    return proc


async def test_kill_9_of_parley_kills_a_process_that_left_the_group(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    m = marker()
    proc = await _parley_running(fake_llm, tmp_path, escape("setsid -f", m) + "; sleep 300")
    pids = await sleepers(m, within=30)
    proc.send_signal(signal.SIGKILL)  # the reaper sees its pipe close
    await proc.wait()
    async with asyncio.timeout(10):
        while pids_running("sleep", m):
            await asyncio.sleep(0.05)
    assert wait_dead(pids) == []


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


async def test_start_up_kills_what_a_crash_of_parley_and_its_reaper_left(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    m = marker()
    proc = await _parley_running(fake_llm, tmp_path, escape("setsid -f", m) + "; sleep 300")
    pids = await sleepers(m, within=30)
    db = tmp_path / "parley.db"
    async with asyncio.timeout(10):  # the ledger row is written soon, not at once
        while not _ledger_rows(db):
            await asyncio.sleep(0.05)
    reapers = [p for p in _children(proc.pid) if b"-S" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(reapers) == 1
    os.kill(reapers[0], signal.SIGKILL)  # both die: nothing kills the tool's processes now
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await asyncio.sleep(0.2)
    assert pids_running("sleep", m) == pids  # the escape outlived both
    async with running_agent(fake_llm, tmp_path) as agent:  # the next start-up
        await agent.reconcile()
    assert wait_dead(pids) == []
    assert not _ledger_rows(db)


def _ledger_rows(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM tool_groups").fetchone()[0])
        except sqlite3.OperationalError:  # not made yet
            return 0


# --- what the command sees -----------------------------------------------------------------


async def test_the_command_keeps_ordinary_signals_and_exit_status(
    settings: SandboxSettings,
) -> None:
    # `kill $$` ends the command (an init would ignore it); the shell's 128 + 15 is reported.
    killed = await sh(settings, "kill -TERM $$; echo survived")
    assert "survived" not in killed.text
    assert "exit_code: 143" in killed.text
    plain = await sh(settings, "echo out; echo err >&2; exit 7")
    assert "exit_code: 7" in plain.text
    assert "stdout:\nout" in plain.text
    assert "stderr:\nerr" in plain.text


async def test_a_process_left_running_is_reported_killed(settings: SandboxSettings) -> None:
    result = await sh(settings, "sleep 30 & echo started")
    assert "started" in result.text
    assert "background processes" in result.text


async def test_the_program_runs_not_a_builtin_of_the_init_shell(
    settings: SandboxSettings,
) -> None:
    # The init is `sh`; a tool whose program is `echo` still gets /bin/echo (sh's own
    # would turn `\n` into a newline).
    result = await run_in_workspace(["echo", "a\\nb"], ToolContext(settings), timeout=5)
    assert "stdout:\na\\nb" in result.text, result.text


async def test_a_missing_program_is_still_an_error_to_report(settings: SandboxSettings) -> None:
    with pytest.raises(ToolError, match="cannot start `no-such-program-xyz`"):
        await run_in_workspace(["no-such-program-xyz"], ToolContext(settings), timeout=5)


def test_start_up_says_how_processes_are_held(settings: SandboxSettings) -> None:
    jail = Jail(settings)
    assert jail.pid_namespaces is not None
    line = jail.describe()
    assert jail.pid_namespaces.detail in line
    if os.geteuid() == 0:  # root: the namespace is made in the spawn thread
        assert "processes (PID and IPC namespace per call)" in line


# --- an ordinary user's Parley: a user + PID namespace through util-linux unshare ---------

_PROBE = r"""
import asyncio, os, sys
from core.tools.base import ToolContext
from core.sandbox.jail import Jail
from core.sandbox.settings import SandboxSettings
from core.tools.running import run_in_workspace

workspace, uid, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
settings = SandboxSettings(
    workspace=workspace, artifacts_dir=workspace + "-art", max_cpu_seconds=77
)
print(Jail(settings).describe())
ctx = ToolContext(settings)
print(asyncio.run(run_in_workspace(["bash", "-c", command], ctx, timeout=20)).text)
"""


async def test_an_ordinary_users_tools_are_held_in_a_namespace_too(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("becoming an ordinary user needs root")
    import pwd

    try:
        user = pwd.getpwnam("parleytest")
    except KeyError:
        pytest.skip("no user `parleytest`")
    holder = tempfile.TemporaryDirectory(dir="/tmp", prefix="parley-pidns-")
    base = Path(holder.name)
    os.chmod(base, 0o777)
    m = marker()
    command = (
        escape("setsid -f", m)
        + "; echo cpu=$(ulimit -t)"
        + "; python3 -c \"import ctypes; print('nnp=%d' % ctypes.CDLL(None).prctl(39,0,0,0,0))\""
        + f"; echo x > {base}/outside; echo wrote=$?"
    )
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(base), "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PROBE, str(base / "ws"), str(user.pw_uid), command,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    try:
        assert "user+PID+IPC namespace per call" in text, text
        assert "cpu=77" in text, text  # the limits hold inside
        assert "nnp=1" in text, text  # and no_new_privs
        assert "wrote=1" in text, text  # and Landlock
        assert not (base / "outside").exists()
        assert wait_dead(pids_running("sleep", m)) == []
    finally:
        holder.cleanup()
