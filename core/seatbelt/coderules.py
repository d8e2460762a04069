"""Programs that take code in an option, for the `bash` blocklist.

The rule is general: a known program given an option whose value is code (`make --eval`,
`gdb -ex`, `vim -c`, `tar --to-command`, `sqlite3 '.shell …'`, `socat EXEC:…`,
`ssh -o ProxyCommand=…`, `rsync -e …`, `zip -TT …`, `man -P …`), or a variable that makes
a later program run its value (`GIT_PAGER=…`, `LESSOPEN=…`, `LD_PRELOAD=…`), needs an
approver: Parley cannot tell what that code does. Each rule looks only at the static words
of one command; `blocklist.py` calls `code_rules` for every command it finds.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from core.seatbelt.context import basename
from core.seatbelt.verdicts import OK, BlockVerdict, unreadable, worst

# The shell or a later program runs these variables' values as code.
CODE_VARIABLES = frozenset({"PS4", "PROMPT_COMMAND", "BASH_ENV", "ENV"})
# Programs run these variables' values as a command (or load them as code); a value from
# `HARMLESS_VALUES` is fine (`GIT_PAGER=cat git log`).
PROGRAM_VARIABLES = frozenset(
    {"GIT_EXTERNAL_DIFF", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_PAGER", "GIT_EDITOR",
     "GIT_SEQUENCE_EDITOR", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_PROXY_COMMAND", "GIT_EXEC_PATH",
     "GIT_TEMPLATE_DIR", "PAGER", "MANPAGER", "SYSTEMD_PAGER", "EDITOR", "VISUAL", "BROWSER",
     "LESSOPEN", "LESSCLOSE", "LD_PRELOAD", "LD_AUDIT", "RSYNC_RSH", "RSYNC_CONNECT_PROG",
     "TAR_OPTIONS", "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "PERL5DB", "PERL5OPT",
     "NODE_OPTIONS", "PYTHONSTARTUP", "FCEDIT", "AWKLIBPATH"}
)  # fmt: skip
HARMLESS_VALUES = frozenset({"", "cat", "true", "false", "less", "more", ":"})
# `GIT_CONFIG_COUNT`, `GIT_CONFIG_KEY_0`, `GIT_CONFIG_PARAMETERS`, `GIT_CONFIG_GLOBAL` …:
# configuration from the environment wins over the neutralised settings tools run with.
GIT_CONFIG_VARIABLE = re.compile(r"GIT_CONFIG(_.*)?")

VIM = frozenset({"vi", "vim", "nvim", "ex", "view", "rvim", "rview", "vimdiff", "gvim", "evim"})
# tar options that run a program; GNU tar takes any unambiguous prefix of a long option,
# so each is matched from the shortest prefix no other tar option shares.
TAR_RUNS = (
    ("--to-c", "--to-command"),
    ("--use-", "--use-compress-program"),
    ("--checkpoint-a", "--checkpoint-action"),
    ("--info", "--info-script"),
    ("--new-v", "--new-volume-script"),
    ("--rsh", "--rsh-command"),
    ("--rmt", "--rmt-command"),
)
TAR_SHORT_VALUES = "bCfFgHIKLNTVX"  # short options taking a value: the rest is not options
SSH_CODE_OPTIONS = re.compile(
    r"(?i)\s*(proxycommand|localcommand|permitlocalcommand|knownhostscommand|match)\b"
)
SOCAT_RUNS = re.compile(r"(?i)(^|!!)\s*(exec|system|shell)[:,]")
SQLITE_RUNS = re.compile(r"(?im)^\s*\.[a-z]|load_extension")
# psql's `\!`, `\o |cmd`, `\g |cmd`, `\w |cmd`, `COPY … PROGRAM '…'`; mysql's `\!` and
# `system`.
SQL_CLIENT_RUNS = re.compile(r"(?ims)\\!|\\[ogw]\s*\||\bprogram\s*'|^\s*system\s")


def _option_values(args: list[str], short: str, long: tuple[str, ...]) -> list[str]:
    """The values of options `-x` (each letter `x` of `short`, alone or ending a cluster of
    flags: `-vo X`) and `--long` in `args`."""
    values: list[str] = []
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else ""
        key, eq, value = arg.partition("=")
        if arg.startswith("--"):
            if key in long:
                values.append(value if eq else following)
        elif arg.startswith("-"):
            at = next((j for j, letter in enumerate(arg[1:], 1) if letter in short), 0)
            if at:
                values.append(arg[at + 1 :] or following)
    return values


def _make(args: list[str], stdin_code: bool) -> BlockVerdict:
    for i, arg in enumerate(args):
        if arg.partition("=")[0].startswith("--ev") or re.match(r"-[a-zA-DF-Z]*E", arg):
            return unreadable("`make --eval` runs text given on the command line")
        if re.match(r"(SHELL|\.SHELLFLAGS|MAKESHELL|MAKEFLAGS)=", arg):
            return unreadable(f"`make {arg.split('=')[0]}=…` changes what make runs")
        makefile = arg.split("=", 1)[1] if arg.startswith("--file=") else ""
        if arg in {"-f", "--file", "--makefile"} and i + 1 < len(args):
            makefile = args[i + 1]
        if stdin_code and makefile in {"-", "/dev/stdin"}:
            return unreadable("`make` reads its makefile from a pipe or heredoc")
    return OK


def _gdb(args: list[str], stdin_code: bool) -> BlockVerdict:
    for arg in args:
        name = arg.lstrip("-").partition("=")[0]
        if arg.startswith("-") and (
            name in {"ex", "iex"} or name.startswith(("eval", "init-eval"))
        ):
            return unreadable(f"`gdb {arg}` runs debugger commands, which can run programs")
    return OK


def _lldb(args: list[str], stdin_code: bool) -> BlockVerdict:
    for arg in args:
        if arg in {"-o", "-O", "-k"} or arg.startswith(("--one-line", "--source-on-crash")):
            return unreadable(f"`lldb {arg}` runs debugger commands, which can run programs")
    return OK


def _vim(name: str, args: list[str], stdin_code: bool) -> BlockVerdict:
    for arg in args:
        if arg in {"-c", "--cmd"} or (arg.startswith("+") and not re.fullmatch(r"\+\d*", arg)):
            return unreadable(f"`{name} {arg}` runs editor commands, which can run programs")
    ex_mode = name == "ex" or bool({"-e", "-E", "-es", "-Es", "-s"} & set(args))
    if stdin_code and ex_mode:
        return unreadable(f"`{name}` reads editor commands from a pipe or heredoc")
    return OK


def _emacs(args: list[str], stdin_code: bool) -> BlockVerdict:
    for arg in args:
        if arg.partition("=")[0] in {"--eval", "-eval", "--execute", "-execute"}:
            return unreadable(f"`emacs {arg}` runs Lisp given on the command line")
    return OK


def _tar(args: list[str], stdin_code: bool) -> BlockVerdict:
    for i, arg in enumerate(args):
        key = arg.partition("=")[0]
        for prefix, option in TAR_RUNS:
            if key.startswith(prefix) and option.startswith(key):
                return unreadable(f"`tar {option}` runs a program")
        if key.startswith("--remove-f") and "--remove-files".startswith(key):
            return BlockVerdict("destructive", "`tar --remove-files` deletes what it archives")
        old_style = i == 0 and not arg.startswith("-")  # `tar xIf prog a.tar`
        if (arg.startswith("-") and not arg.startswith("--")) or old_style:
            letters = arg.lstrip("-")
            cut = min((letters.index(c) for c in TAR_SHORT_VALUES if c in letters), default=-1)
            if cut >= 0 and letters[cut] in "IF":
                return unreadable(f"`tar -{letters[cut]}` runs a program")
    return OK


def _sqlite(args: list[str], stdin_code: bool, stdin_text: str | None) -> BlockVerdict:
    if any(arg.lstrip("-") == "cmd" for arg in args):
        return unreadable("`sqlite3 -cmd` runs a command before the SQL")
    if any(SQLITE_RUNS.search(arg) for arg in args if not arg.startswith("-")):
        return unreadable("a sqlite3 dot-command or extension can run programs")
    if stdin_code and (stdin_text is None or SQLITE_RUNS.search(stdin_text)):
        return unreadable("`sqlite3` reads dot-commands from a pipe or heredoc")
    return OK


def _sql_client(name: str, args: list[str], stdin_code: bool, text: str | None) -> BlockVerdict:
    if any(SQL_CLIENT_RUNS.search(arg) for arg in args) or (
        stdin_code and (text is None or SQL_CLIENT_RUNS.search(text))
    ):
        return unreadable(f"`{name}` is given client commands or SQL that run programs")
    return OK


def _rsync(args: list[str]) -> BlockVerdict:
    for arg in args:
        if arg.startswith("--del") or arg in {"--remove-source-files", "--remove-sent-files"}:
            return BlockVerdict("destructive", f"`rsync {arg}` deletes files")
        if arg.startswith("--rsync-path"):
            return unreadable("`rsync --rsync-path` runs a program chosen on the command line")
    shells = _option_values(args, "", ("--rsh",))
    shells += [
        arg.split("e", 1)[1] or (args[i + 1] if i + 1 < len(args) else "")
        for i, arg in enumerate(args)
        if re.fullmatch(r"-[a-zA-Z]*e.*", arg) and not arg.startswith("--")
    ]
    for shell in shells:
        words = shell.split()
        if not words or basename(words[0]) != "ssh" or _ssh(words[1:]).kind != "ok":
            return unreadable(f"`rsync -e {shell}` runs a program other than ssh")
    return OK


def _ssh(args: list[str]) -> BlockVerdict:
    for value in _option_values(args, "o", ()):
        if SSH_CODE_OPTIONS.match(value):
            return unreadable(f"`ssh -o {value}` runs a local command")
    return OK


def _scp(name: str, args: list[str]) -> BlockVerdict:
    programs = _option_values(args, "SD" if name == "sftp" else "S", ())
    if programs:
        return unreadable(f"`{name} -S` runs the program {programs[0]}")
    return _ssh(args)


def _socat(args: list[str]) -> BlockVerdict:
    if any(SOCAT_RUNS.search(arg) for arg in args):
        return unreadable("a socat EXEC/SYSTEM address runs a program")
    return OK


def _netcat(name: str, args: list[str]) -> BlockVerdict:
    for arg in args:
        if arg in {"-e", "-c", "--exec", "--sh-exec", "--lua-exec"} or arg.startswith(
            ("--exec=", "--sh-exec=", "--lua-exec=")
        ):
            return unreadable(f"`{name} {arg}` runs a program for each connection")
    return OK


def _zip(args: list[str]) -> BlockVerdict:
    if any(arg.startswith(("-TT", "--unzip-command")) for arg in args):
        return unreadable("`zip -TT` runs a program to test the archive")
    return OK


def _man(args: list[str]) -> BlockVerdict:
    if any(re.match(r"-P|--pager|-H|--html", arg) for arg in args):
        return unreadable("`man -P`/`-H` runs a program chosen on the command line")
    return OK


def _dc(args: list[str], stdin_code: bool, stdin_text: str | None) -> BlockVerdict:
    if any("!" in arg for arg in args) or (
        stdin_code and (stdin_text is None or "!" in stdin_text)
    ):
        return unreadable("the dc `!` command runs a shell command")
    return OK


def _ed(args: list[str], stdin_code: bool, stdin_text: str | None) -> BlockVerdict:
    if stdin_code and (stdin_text is None or "!" in stdin_text):
        return unreadable("ed commands from a pipe or heredoc can run shell commands (`!`)")
    return OK


def _m4(args: list[str], stdin_code: bool, stdin_text: str | None) -> BlockVerdict:
    runs = re.compile(r"syscmd|esyscmd")
    if any(runs.search(arg) for arg in args) or (
        stdin_code and (stdin_text is None or runs.search(stdin_text))
    ):
        return unreadable("m4 `syscmd`/`esyscmd` runs shell commands")
    return OK


def _cmake(args: list[str]) -> BlockVerdict:
    command = args[1] if len(args) > 1 and args[0] == "-E" else ""
    if command in {"rm", "remove", "remove_directory"}:
        return BlockVerdict("destructive", f"`cmake -E {command}` deletes files")
    if command in {"env", "time", "chdir"}:
        return unreadable(f"`cmake -E {command}` runs a command of its own")
    return OK


def _strace(args: list[str]) -> BlockVerdict:
    for value in _option_values(args, "o", ("--output",)):
        if value[:1] in {"|", "!"}:
            return unreadable("`strace -o |cmd` pipes its output into a command")
    return OK


_Rule = Callable[[str, list[str], bool, "str | None"], BlockVerdict]
_RULES: dict[str, _Rule] = {
    "make": lambda n, a, c, t: _make(a, c),
    "gmake": lambda n, a, c, t: _make(a, c),
    "gdb": lambda n, a, c, t: _gdb(a, c),
    "lldb": lambda n, a, c, t: _lldb(a, c),
    "emacs": lambda n, a, c, t: _emacs(a, c),
    "tar": lambda n, a, c, t: _tar(a, c),
    "gtar": lambda n, a, c, t: _tar(a, c),
    "bsdtar": lambda n, a, c, t: _tar(a, c),
    "sqlite3": lambda n, a, c, t: _sqlite(a, c, t),
    "sqlite": lambda n, a, c, t: _sqlite(a, c, t),
    "psql": _sql_client,
    "mysql": _sql_client,
    "mariadb": _sql_client,
    "rsync": lambda n, a, c, t: _rsync(a),
    "ssh": lambda n, a, c, t: _ssh(a),
    "autossh": lambda n, a, c, t: _ssh(a),
    "scp": lambda n, a, c, t: _scp(n, a),
    "sftp": lambda n, a, c, t: _scp(n, a),
    "socat": lambda n, a, c, t: _socat(a),
    "nc": lambda n, a, c, t: _netcat(n, a),
    "ncat": lambda n, a, c, t: _netcat(n, a),
    "netcat": lambda n, a, c, t: _netcat(n, a),
    "zip": lambda n, a, c, t: _zip(a),
    "man": lambda n, a, c, t: _man(a),
    "dc": lambda n, a, c, t: _dc(a, c, t),
    "ed": lambda n, a, c, t: _ed(a, c, t),
    "red": lambda n, a, c, t: _ed(a, c, t),
    "m4": lambda n, a, c, t: _m4(a, c, t),
    "strace": lambda n, a, c, t: _strace(a),
    "cmake": lambda n, a, c, t: _cmake(a),
    **{editor: lambda n, a, c, t: _vim(n, a, c) for editor in VIM},
}


def code_rules(
    name: str, args: list[str], *, stdin_code: bool, stdin_text: str | None
) -> BlockVerdict:
    """The verdict on program `name` taking code in one of its static words `args`
    (`stdin_code`: its stdin is a pipe, heredoc or here-string, holding `stdin_text` if
    that is known)."""
    rule = _RULES.get(name)
    return OK if rule is None else rule(name, args, stdin_code, stdin_text)


def code_variable(name: str, values: list[str]) -> BlockVerdict:
    """The verdict on setting variable `name` to `values` (its words after expansion)."""
    value = " ".join(values)
    if name in CODE_VARIABLES:
        return unreadable(f"setting {name}, which the shell later runs as code")
    if GIT_CONFIG_VARIABLE.fullmatch(name):
        return unreadable(f"`{name}` gives git configuration that can make it run programs")
    if name in PROGRAM_VARIABLES and value not in HARMLESS_VALUES:
        return unreadable(f"`{name}={value[:40]}` makes a program run or load that value")
    return OK


def code_variables(assignments: list[str]) -> BlockVerdict:
    """`code_variable` over `NAME=value` words (`env A=1 cmd`)."""
    verdicts = []
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        verdicts.append(code_variable(name, [value]))
    return worst(verdicts)
