"""The `bash` blocklist, table-driven, plus how its verdicts reach the executor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.messages import ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.seatbelt.blocklist import check_command
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashParams, BashTool
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

BLOCKED = [
    "sudo rm x",
    "echo ok; sudo rm x",
    "echo ok && sudo rm x",
    "false || sudo rm x",
    "echo ok\nsudo rm x",
    "echo $(sudo x)",
    'echo "$(sudo x)"',
    "echo `sudo x`",
    'echo "`sudo x`"',
    "x=$(echo $(sudo id))",
    "cat <(sudo ls)",
    "(cd /tmp; sudo ls)",
    "env FOO=1 sudo x",
    "env -i FOO=1 BAR=2 sudo x",
    "FOO=1 sudo x",
    'sh -c "sudo x"',
    "bash -lc 'echo hi; sudo x'",
    "bash -o pipefail -c 'ls | sudo tee x'",
    "sh -c \"bash -c 'sudo x'\"",
    "nohup sudo x &",
    "timeout 5 sudo x",
    "nice -n 5 sudo x",
    "exec sudo x",
    "command sudo x",
    "/usr/bin/sudo x",
    "if true; then reboot; fi",
    "su - root",
    "doas ls",
    "shutdown -h now",
    "poweroff",
    "halt",
    "mkfs.ext4 /dev/sdb1",
    "mkfs -t ext4 /dev/sdb1",
    "dd if=/dev/zero of=/dev/sda bs=1M",
    "echo x > /dev/sda",
    "cat img > /dev/nvme0n1",
    ":(){ :|:& };:",
    "bomb(){ bomb|bomb& };bomb",
    "rm -rf /",
    "rm -rf /*",
    "rm -rf ~",
    "rm -rf ~/",
    'rm -rf "$HOME"',
    "rm -rf ${HOME}/*",
    "rm -fr /etc",
    "rm -r --no-preserve-root /",
    "nohup rm -rf / &",
    "chmod -R 777 /",
    "chmod 777 /",
    "chown -R nobody /",
]

DESTRUCTIVE = [
    "rm -rf build",
    "rm -r build",
    "rm -f file.txt",
    "ls | xargs rm -rf",
    "find . -name '*.pyc' -exec rm -f {} \\;",
    "find . -delete",
    "chmod 777 script.sh",
    "chown -R me:me dir",
    "git push --force",
    "git push -f origin main",
    "git push origin +main",
    "git -C repo push --force-with-lease",
    "git reset --hard HEAD~1",
    "git clean -fdx",
    "kill -9 1234",
    "kill -s KILL 1234",
    "pkill python",
    "killall node",
    "truncate -s 0 log.txt",
    "dd if=/dev/zero of=disk.img bs=1M count=1",  # dd overwrites in place: an approver sees it
    "echo 1 > /etc/hosts",
    "tee -a /etc/hosts < x",
    "echo 'unbalanced",  # unparseable: ask rather than crash
    # These four were `ok` before approvals failed closed: inline interpreter code and a
    # program read from a pipe or heredoc cannot be checked, so an approver must say yes.
    "python3 -c 'print(1)'",
    "echo 'print(1)' | python3",
    "python3 - <<'EOF'\nprint(1)\nEOF",
    "node -e 'console.log(1)'",
]

INTERACTIVE = [
    "vim notes.txt",
    "vi x",
    "nvim",
    "nano x",
    "emacs x",
    "less log.txt",
    "cat log | more",
    "python",
    "python3",
    "python3 -i",
    "node",
    "irb",
    "top",
    "htop",
    "watch ls",
    "ssh example.com",
    "ssh -p 2222 user@example.com",
]

OK = [
    "ls -la",
    "grep -r foo .",
    "rm file.txt",  # single-file deletes stay `ok`: routine, and the path walls still apply
    "echo hello > out.txt",
    "cat a | sort | uniq -c",
    "ls -la 2>&1 | head",
    "python3 script.py",
    "python3 -m pytest -q",
    "ssh example.com uptime",
    "ssh -p 2222 host 'df -h'",
    "top -b -n 1",
    "emacs --batch -l build.el",
    "git status",
    "git push origin main",
    "git log --format='%h#%s'",
    "kill 1234",
    "dd if=x of=/dev/null",
    "chmod +x run.sh",
    "chmod -R u+w dir",
    "find . -name '*.py' -exec grep -l TODO {} +",
    "echo 'sudo is just a word here'",
    "echo sudo",
    "npm test && npm run build",
    "cat > app.py <<'EOF'\nimport os\nprint(os.getcwd())\nEOF",
    'for f in *.txt; do wc -l "$f"; done',
    "echo $((1 + 2))",
]


@pytest.mark.parametrize("command", BLOCKED)
def test_blocked(command: str) -> None:
    verdict = check_command(command)
    assert verdict.kind == "blocked", verdict
    assert verdict.reason


@pytest.mark.parametrize("command", DESTRUCTIVE)
def test_destructive(command: str) -> None:
    verdict = check_command(command)
    assert verdict.kind == "destructive", verdict
    assert verdict.reason


@pytest.mark.parametrize("command", INTERACTIVE)
def test_interactive_with_hint(command: str) -> None:
    verdict = check_command(command)
    assert verdict.kind == "interactive", verdict
    assert any(word in verdict.reason for word in ("use", "pass", "add", "write"))


@pytest.mark.parametrize("command", OK)
def test_ok(command: str) -> None:
    assert check_command(command).kind == "ok", check_command(command)


def test_worst_verdict_wins() -> None:
    assert check_command("vim x; rm -rf build").kind == "interactive"
    assert check_command("rm -rf build; sudo ls").kind == "blocked"
    assert check_command("vim x; sudo ls").kind == "blocked"


@given(st.text(max_size=300))
def test_never_raises(command: str) -> None:
    assert check_command(command).kind in {"ok", "destructive", "blocked", "interactive"}


def test_long_input_is_checked_quickly() -> None:
    assert check_command("a" * 50_000 + " (){ x; }").kind == "ok"


# --- through the tool and the executor --------------------------------------------------


def test_bash_category_escalates_only_for_destructive() -> None:
    tool = BashTool()
    assert tool.effective_category(BashParams(command="ls")) == "write"
    assert tool.effective_category(BashParams(command="rm -rf build")) == "admin"
    # Blocked and interactive commands are refused by run(); no approver is bothered.
    assert tool.effective_category(BashParams(command="sudo ls")) == "write"
    assert tool.effective_category(BashParams(command="vim x")) == "write"


@pytest.fixture
def settings(tmp_path: Path) -> SandboxSettings:
    return SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "artifacts")


async def test_destructive_command_needs_approval(settings: SandboxSettings) -> None:
    answers = iter([False, True])
    asked: list[str] = []

    async def approver(tool: str, summary: str, reason: str) -> bool:
        asked.append(reason)
        return next(answers)

    workspace = settings.resolved_workspace()
    (workspace / "build").mkdir(parents=True)
    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": "rm -rf build"}))
    run = RunContext(approver=approver)
    refused = await executor.execute(call, run)
    assert refused.is_error
    assert "not approved" in refused.content
    assert (workspace / "build").exists()
    approved = await executor.execute(call, run)
    assert not approved.is_error
    assert "exit_code: 0" in approved.content
    assert not (workspace / "build").exists()
    assert len(asked) == 2


async def test_interactive_command_is_refused_with_hint(settings: SandboxSettings) -> None:
    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": "less notes.txt"}))
    result = await executor.execute(call)
    assert result.is_error
    assert "command refused (stdin is closed)" in result.content
    assert "use `cat`" in result.content


async def test_bash_naming_a_denied_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    settings = SandboxSettings(workspace=tmp_path / "ws", denied_paths=[Path("~/.ssh")])
    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": "cat ~/.ssh/id_rsa"}))
    result = await executor.execute(call)
    assert result.is_error
    assert f"names the denied path {tmp_path / 'home' / '.ssh'}" in result.content
    assert "PRIVATE KEY" not in result.content
