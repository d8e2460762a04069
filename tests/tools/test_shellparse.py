"""The shell parser never takes the process down, whatever text the model sends."""

from __future__ import annotations

import subprocess
import sys

from core.seatbelt.blocklist import check_command

# Found by fuzzing: tree-sitter-bash's scanner crashed (SIGSEGV) on these, killing Parley.
CRASHED = ["{\U0010ffff", "x{\U00104c4d", "{\U00080000", "{\U000e0000", "{\udc00"]


def test_characters_that_crashed_the_scanner_are_parsed_in_a_live_process() -> None:
    code = (
        "import sys\n"
        "from core.seatbelt.blocklist import check_command\n"
        "for line in sys.stdin.read().split('\\0'):\n"
        "    check_command(line)\n"
        "print('alive')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input="\0".join(CRASHED * 50).encode("utf-8", "surrogatepass"),
        capture_output=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, b"alive"), done.stderr[-2000:]


def test_text_outside_the_basic_plane_keeps_its_meaning() -> None:
    assert check_command('git commit -m "🎉 ship it"').kind == "ok"
    assert check_command("rm -rf /tmp/🎉 /").kind == "blocked"
    assert check_command("echo 🎉 | sudo tee /etc/x").kind == "blocked"
