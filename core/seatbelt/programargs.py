"""How common programs take their arguments, for the `bash` blocklist.

`sh -c`, interpreters' inline-code flags (`python3 -c`, `perl -e` …), sed scripts,
option clusters and `ssh`'s remote command (wrappers such as `env` and `xargs` are in
`wrappers.py`). Which of those are dangerous is decided in `blocklist.py`,
`commandrules.py`, `coderules.py` and `gitrules.py`, not here.
"""

from __future__ import annotations

import re

from core.records import record
from core.seatbelt.shellexpand import Word

STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
# Programs that hand the value of one of their options to a shell (`script -c 'cmd'`).
SHELL_OPTIONS: dict[str, tuple[str, ...]] = {
    "script": ("-c", "--command"),
    "npx": ("-c", "--call"),
}


@record(frozen=True, slots=True)
class Interpreter:
    """How an interpreter takes its program: inline, from a file or module, or stdin."""

    inline: str = ""  # short flags whose value is program text (`-c`, `-e`)
    inline_long: frozenset[str] = frozenset()  # long flags likewise, lower-case
    takes_arg: str = ""  # short flags taking a value: attached, or the next argument
    attached: str = ""  # short flags taking the rest of their cluster only (`-Mstrict`)
    program: str = ""  # short flags naming the program (a module or a file)
    subcommands: frozenset[str] = frozenset()  # `deno eval CODE`


_EVAL = frozenset({"--eval", "--print"})
INTERPRETERS: tuple[tuple[re.Pattern[str], Interpreter], ...] = tuple(
    (re.compile(pattern), spec)
    for pattern, spec in (
        (r"(python|pypy)[\d.]*", Interpreter("c", takes_arg="WX", program="m")),
        (r"perl[\d.]*", Interpreter("eE", attached="IMmx0lCdDiV")),
        (r"ruby[\d.]*|irb", Interpreter("e", takes_arg="rIC", attached="0iFx")),
        (r"node(js)?|bun", Interpreter("ep", _EVAL, takes_arg="r")),
        (r"deno", Interpreter(subcommands=frozenset({"eval"}))),
        (r"php[\d.]*", Interpreter("rBRE", takes_arg="cdz", program="f")),
        (r"lua(jit|[\d.]*)", Interpreter("e", takes_arg="l")),
        (r"R|Rscript|osascript|expect", Interpreter("ec", takes_arg="l")),
        (r"julia", Interpreter("eE", _EVAL)),
        (r"pwsh|powershell", Interpreter("c", frozenset({"-command", "-encodedcommand"}))),
        (r"tclsh[\d.]*|wish", Interpreter()),
        (r"guile[\d.]*", Interpreter("c", takes_arg="l")),
        (r"racket", Interpreter("e", frozenset({"--eval"}))),
        (r"elixir", Interpreter("e", frozenset({"--eval"}))),
        (r"erl", Interpreter(inline_long=frozenset({"-eval"}))),
        (r"groovy", Interpreter("e")),
        (r"gnuplot", Interpreter("e")),
        (r"octave(-cli)?", Interpreter(inline_long=frozenset({"--eval"}))),
        (r"ts-node|tsx", Interpreter("ep", _EVAL)),
    )
)


def interpreter_for(name: str) -> Interpreter | None:
    return next((spec for pattern, spec in INTERPRETERS if pattern.fullmatch(name)), None)


def interpreter_args(spec: Interpreter, args: list[Word]) -> tuple[Word | None, list[Word], bool]:
    """(inline code, operands, names a program file/module) from an interpreter's args."""
    i = 0
    while i < len(args):
        arg, following = args[i].text, args[i + 1] if i + 1 < len(args) else Word("")
        if arg == "--":
            return None, args[i + 1 :], False
        if arg == "-" or not arg.startswith("-"):
            break
        key, _, value = arg.partition("=")
        if key.lower() in spec.inline_long:
            code = Word(value, args[i].dynamic, args[i].known) if "=" in arg else following
            return code, [], False
        for j, flag in enumerate(arg[1:] if not arg.startswith("--") else "", 1):
            rest = Word(arg[j + 1 :], args[i].dynamic, args[i].known)
            if flag in spec.inline:
                return (rest if rest.text else following), [], False
            if flag in spec.program:
                return None, [], True
            if flag in spec.attached or flag in spec.takes_arg:
                i += flag in spec.takes_arg and not rest.text
                break
        i += 1
    return None, args[i:], False


def sed_scripts(words: list[str]) -> list[str]:
    """The scripts in `sed` arguments (`-e` values, else the first operand)."""
    scripts: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--expression" or re.fullmatch(r"-[a-zA-Z]*e", word):
            scripts += words[i + 1 : i + 2]
            i += 1
        elif word.startswith("--expression="):
            scripts.append(word.split("=", 1)[1])
        elif word in {"-f", "--file", "-l", "--line-length"}:
            i += 1
        elif not word.startswith("-") and not scripts:
            return [word]
        i += 1
    return scripts


def option_value(args: list[Word], names: tuple[str, ...]) -> Word | None:
    """The value of the first of the options `names` in `args`: `--command=V`, `-c V`, or
    a short one at the end of a cluster of flags (`-qc V`)."""
    short = "".join(n[1] for n in names if len(n) == 2)
    for i, arg in enumerate(args):
        key, eq, value = arg.text.partition("=")
        if key in names and key.startswith("--") and eq:
            return Word(value, arg.dynamic, arg.known)
        clustered = re.fullmatch(r"-[a-zA-Z]+", arg.text) and arg.text[-1] in short
        if arg.text in names or clustered:
            return args[i + 1] if i + 1 < len(args) else Word("")
    return None


def shell_args(args: list[Word]) -> tuple[Word | None, bool, list[Word]]:
    """(`-c` script, whether the program is read from stdin, operands) for `sh`/`bash` args."""
    command_mode, reads_stdin, i = False, False, 0
    while i < len(args) and args[i].text[:1] in {"-", "+"} and args[i].text not in STDIN_PATHS:
        arg = args[i].text
        if arg == "--":
            i += 1
            break
        if arg in {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}:
            i += 1
        elif not arg.startswith("--"):
            command_mode |= "c" in arg[1:]
            reads_stdin |= "s" in arg[1:]
        i += 1
    operands = args[i:]
    if command_mode:
        return (operands[0] if operands else Word("")), False, operands[1:]
    return None, reads_stdin or not operands or operands[0].text in STDIN_PATHS, operands


def options(args: list[str]) -> tuple[set[str], list[str]]:
    """Split args into option letters/long names and operands (after `--`, all operands)."""
    opts: set[str] = set()
    operands: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            operands += args[i + 1 :]
            break
        if arg.startswith("--"):
            opts.add(arg.split("=", 1)[0])
        elif arg.startswith("-") and len(arg) > 1:
            opts.update(f"-{c}" for c in arg[1:])
        else:
            operands.append(arg)
    return opts, operands


def ssh_has_command(args: list[str]) -> bool:
    i, positional = 0, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            i += 2 if arg[-1] in "BbcDEeFIiJLlmOopQRSWw" and len(arg) == 2 else 1
            continue
        positional += 1
        i += 1
    return positional >= 2
