"""Dangerous-command checks for `bash` (SPEC §4, §13): defence in depth, not the wall.

The command is split with `shlex` into simple commands across `;`, `&&`, `||`, `|`, `&`,
newlines, `( )`, `$( )`, backticks and `<( )`; wrappers (`env`, `sh -c`, `xargs`,
`timeout` …) are peeled off and every inner command is judged. The worst verdict wins:
blocked > interactive > destructive > ok.

Deliberate over-approximations (they err towards asking, never towards running):
comments and heredoc bodies are parsed as commands, and `$( )` inside single quotes
counts as a substitution. Unparseable input is "destructive" (a human is asked).
A plain `rm file` (no -r/-f) stays "ok": deleting single files in the workspace is
routine, and the filesystem walls and the `write` category already apply.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

VerdictKind = Literal["ok", "destructive", "blocked", "interactive"]

# --- tables ------------------------------------------------------------------------------

BLOCKED_COMMANDS = frozenset(
    {"sudo", "su", "doas", "pkexec", "shutdown", "reboot", "halt", "poweroff", "telinit"}
)
BLOCKED_PREFIXES = ("mkfs",)  # mkfs, mkfs.ext4, mkfs.vfat …
DISK_TOOLS = frozenset({"mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "parted"})
DESTRUCTIVE_COMMANDS = frozenset({"pkill", "killall", "truncate", "shred"})
EDITORS = frozenset({"vi", "vim", "nvim", "nano", "emacs", "pico", "joe", "micro"})
PAGERS = frozenset({"less", "more", "most"})
MONITORS = frozenset({"top", "htop", "btop", "atop", "watch"})
REPLS = frozenset({"python", "python3", "node", "irb", "ipython", "bpython", "deno", "ghci"})
# Flags that leave a REPL interactive; anything else (a script, -c, -m, -e, -V) does not.
REPL_PASSIVE_FLAGS = frozenset({"-i", "-q", "-u", "-B", "-E", "-I", "-s", "-S", "--interactive"})
# Targets whose recursive deletion or chmod is never acceptable.
CRITICAL_TARGETS = frozenset(
    {"/", "~", "$HOME", "${HOME}", "/bin", "/boot", "/dev", "/etc", "/home", "/lib",
     "/lib64", "/opt", "/proc", "/root", "/sbin", "/sys", "/usr", "/var"}
)  # fmt: skip
# Redirecting into these is a system change.
SYSTEM_PREFIXES = ("/etc/", "/usr/", "/bin/", "/sbin/", "/boot/", "/lib/", "/sys/", "/proc/")
BLOCK_DEVICE = re.compile(r"^/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|loop)")
SAFE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/stdout", "/dev/stderr", "/dev/tty"})
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
# Wrappers that run the rest of their argv; the value is the options taking an argument.
WRAPPERS: dict[str, frozenset[str]] = {
    "nohup": frozenset(),
    "exec": frozenset({"-a"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "time": frozenset({"-f", "-o"}),
    "nice": frozenset({"-n"}),
    "ionice": frozenset({"-c", "-n", "-p"}),
    "setsid": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "busybox": frozenset(),
    "xargs": frozenset({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
}
# Leading words that do not name the command: shell keywords and group braces.
KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                      "while", "until", "case", "esac", "function"})  # fmt: skip
# The lookbehind anchors the name at the start of a word, keeping the search linear.
FORK_BOMB = re.compile(r"(?<![\w:.-])([\w:.-]+)\s*\(\s*\)\s*\{[^}]*\1\s*\|\s*&?\s*\1")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATOR_CHARS = "();<>|&\n"
_MAX_DEPTH = 8

_RANK: dict[VerdictKind, int] = {"ok": 0, "destructive": 1, "interactive": 2, "blocked": 3}


@dataclass(frozen=True, slots=True)
class BlockVerdict:
    """How `bash` must treat a command, and why (phrased for the model)."""

    kind: VerdictKind
    reason: str = ""


_OK = BlockVerdict("ok")


def _worst(verdicts: list[BlockVerdict]) -> BlockVerdict:
    return max(verdicts, key=lambda v: _RANK[v.kind], default=_OK)


@dataclass(slots=True)
class _Simple:
    words: list[str] = field(default_factory=list)
    out_targets: list[str] = field(default_factory=list)  # `> file` targets
    stdin_fed: bool = False  # after a pipe or with `<`/`<<`: a bare REPL reads a script


# --- parsing -----------------------------------------------------------------------------


def _tokens(command: str) -> list[str]:
    """Shell-ish tokens; operators come out as runs of `();<>|&` and newlines."""
    # Bash drops backslash-newline; backticks are the old spelling of `$( )`.
    text = command.replace("\\\n", "")
    parts = text.split("`")
    text = "".join(p + ("$(" if i % 2 == 0 else ")") for i, p in enumerate(parts[:-1]))
    text += parts[-1]
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_OPERATOR_CHARS)
    lexer.whitespace = " \t\r"  # newlines separate commands, so they are operators
    lexer.whitespace_split = True
    lexer.commenters = ""  # `#` mid-word is not a comment; shlex would hide the rest
    return list(lexer)


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in _OPERATOR_CHARS for c in token)


def _split(command: str) -> list[_Simple]:
    """Split into simple commands; raises ValueError on unbalanced quotes."""
    commands = [_Simple()]
    expect_target = False
    for token in _tokens(command):
        current = commands[-1]
        if not _is_operator(token):
            if expect_target:
                current.out_targets.append(token)
                expect_target = False
            else:
                current.words.append(token)
            continue
        redirect = ("<" in token or ">" in token) and not token.endswith("(")
        separates = any(c in token for c in "();|\n") or ("&" in token and not redirect)
        if separates and not redirect:
            commands.append(_Simple(stdin_fed="|" in token and "||" not in token))
        elif separates:  # e.g. `)>` closes a subshell and redirects its output
            commands.append(_Simple())
        if redirect:
            expect_target = ">" in token  # `2>&1` records "1": harmless, and not a command
            commands[-1].stdin_fed |= ">" not in token
    return [c for c in commands if c.words or c.out_targets]


def _substitutions(word: str) -> list[str]:
    """Bodies of `$( … )` inside a word (quoted words keep them in one token)."""
    bodies = []
    start = word.find("$(")
    while start != -1:
        depth, i = 1, start + 2
        while i < len(word) and depth:
            depth += {"(": 1, ")": -1}.get(word[i], 0)
            i += 1
        bodies.append(word[start + 2 : i - 1 if depth == 0 else i])
        start = word.find("$(", i)
    return bodies


def _check(command: str, depth: int) -> BlockVerdict:
    if depth > _MAX_DEPTH:
        return BlockVerdict("destructive", "commands nested too deeply to check")
    if FORK_BOMB.search(command):
        return BlockVerdict("blocked", "a fork bomb")
    verdicts = []
    for simple in _split(command):
        verdicts.append(_check_simple(simple, depth))
        words = simple.words + simple.out_targets
        verdicts += [_check(b, depth + 1) for w in words for b in _substitutions(w)]
    return _worst(verdicts)


def check_command(command: str) -> BlockVerdict:
    """Classify a `bash` command string; never raises."""
    try:
        return _check(command, 0)
    except ValueError as exc:  # shlex: unbalanced quotes or a dangling escape
        return BlockVerdict("destructive", f"the command could not be parsed ({exc})")


# --- judging one simple command ------------------------------------------------------------


def _options(args: list[str]) -> tuple[set[str], list[str]]:
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


def _is_critical(target: str) -> bool:
    stripped = re.sub(r"(/\.?|/\*)+$", "", target.replace("//", "/")) or "/"
    home = os.path.expanduser("~")
    return stripped in CRITICAL_TARGETS or stripped in {home, "~/", "$HOME/"}


def _skip_wrapper(name: str, args: list[str]) -> list[str]:
    """The argv a wrapper runs (options, assignments and `timeout`'s duration removed)."""
    takes_arg = WRAPPERS[name]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if name == "env" and arg in {"-S", "--split-string"} and i + 1 < len(args):
            return args[i + 1].split() + args[i + 2 :]  # `env -S "cmd args"`
        if name == "env" and ASSIGNMENT.match(arg):
            i += 1
        elif arg.startswith("-") and len(arg) > 1:
            i += 2 if arg in takes_arg else 1
        else:
            break
    rest = args[i:]
    return rest[1:] if name == "timeout" and rest else rest


def _shell_string(args: list[str]) -> str | None:
    """The script of `sh -c 'script'` (also `-lc`, `-o pipefail -c` …), else None."""
    i = 0
    while i < len(args) and args[i][:1] in {"-", "+"}:
        arg = args[i]
        if arg in {"-o", "+o", "-O", "+O"}:
            i += 2
            continue
        if arg[:2] != "--" and "c" in arg[1:] and i + 1 < len(args):
            return args[i + 1]
        i += 1
    return None


def _rm(args: list[str]) -> BlockVerdict:
    opts, targets = _options(args)
    recursive = bool(opts & {"-r", "-R", "--recursive"})
    forced = bool(opts & {"-f", "--force"})
    if "--no-preserve-root" in opts or ((recursive or forced) and any(map(_is_critical, targets))):
        return BlockVerdict("blocked", "`rm` of the root or home directory")
    if recursive or forced:
        return BlockVerdict("destructive", "a recursive or forced delete (`rm -r`/`rm -f`)")
    return _OK


def _chmod_chown(name: str, args: list[str]) -> BlockVerdict:
    opts, operands = _options(args)
    recursive = bool(opts & {"-R", "--recursive"})
    world = name == "chmod" and any(re.fullmatch(r"0?777|a\+rwx", a) for a in operands)
    if (recursive or world) and any(map(_is_critical, operands[1:])):
        return BlockVerdict("blocked", f"`{name}` on the root or home directory")
    if world:
        return BlockVerdict("destructive", "`chmod 777` makes files writable by everyone")
    if recursive and name != "chmod":
        return BlockVerdict("destructive", f"a recursive `{name}`")
    return _OK


def _git(args: list[str]) -> BlockVerdict:
    while args and args[0].startswith("-"):  # global options: -C dir, -c k=v, --no-pager
        args = args[2:] if args[0] in {"-C", "-c"} else args[1:]
    if not args:
        return _OK
    sub, rest = args[0], args[1:]
    opts, operands = _options(rest)
    if sub == "push" and (
        opts & {"-f", "--force", "--force-with-lease", "--delete", "-d", "--mirror"}
        or any(o.startswith("+") for o in operands)
    ):
        return BlockVerdict("destructive", "`git push` that rewrites or deletes remote history")
    if sub == "reset" and "--hard" in opts:
        return BlockVerdict("destructive", "`git reset --hard` discards local changes")
    if sub == "clean" and opts & {"-f", "--force"}:
        return BlockVerdict("destructive", "`git clean -f` deletes untracked files")
    if sub == "branch" and "-D" in opts:
        return BlockVerdict("destructive", "`git branch -D` deletes an unmerged branch")
    return _OK


def _kill(args: list[str]) -> BlockVerdict:
    joined = " ".join(args)
    if re.search(r"(^|\s)-(9|KILL|SIGKILL)\b|-s\s+(9|KILL|SIGKILL)\b", joined):
        return BlockVerdict("destructive", "`kill -9` cannot be caught or cleaned up after")
    return _OK


def _dd(args: list[str]) -> BlockVerdict:
    for arg in args:
        device = arg[3:]
        if arg.startswith("of=/dev/") and not (
            device in SAFE_DEVICES or device.startswith("/dev/fd/")
        ):
            return BlockVerdict("blocked", "`dd` writing to a device")
    return _OK


def _find(args: list[str], depth: int) -> BlockVerdict:
    verdicts = [BlockVerdict("destructive", "`find -delete`")] if "-delete" in args else []
    for i, arg in enumerate(args):
        if arg in {"-exec", "-execdir", "-ok", "-okdir"}:
            inner = []
            for word in args[i + 1 :]:
                if word in {";", "+"}:
                    break
                inner.append(word)
            verdicts.append(_check_simple(_Simple(inner), depth + 1))
    return _worst(verdicts)


def _interactive(name: str, args: list[str], stdin_fed: bool) -> BlockVerdict:
    if name in EDITORS and not {"--batch", "-batch", "--headless", "-es", "-Es"} & set(args):
        hint = "write files with write_file, or edit with `sed -i`/`python3 -c`"
        return BlockVerdict("interactive", f"`{name}` is an interactive editor; {hint}")
    if name in PAGERS:
        hint = "use `cat`, `head`, `tail` or read_file with offset/limit"
        return BlockVerdict("interactive", f"`{name}` is a pager; {hint}")
    if name in MONITORS and not (name == "top" and "-b" in _options(args)[0]):
        hint = "use a one-shot form such as `ps aux` or `top -b -n 1`"
        return BlockVerdict("interactive", f"`{name}` runs until stopped; {hint}")
    is_repl = name in REPLS or re.fullmatch(r"python3(\.\d+)?", name)
    # A REPL fed through a pipe or `<<EOF` runs that script; only a bare one would sit idle.
    if is_repl and not stdin_fed and all(a in REPL_PASSIVE_FLAGS for a in args):
        hint = "pass a script or a one-liner with `-c`/`-e`"
        return BlockVerdict("interactive", f"bare `{name}` starts a REPL; {hint}")
    if name == "ssh" and not stdin_fed and not _ssh_has_command(args):
        hint = "add the remote command, e.g. `ssh host 'uptime'`"
        return BlockVerdict("interactive", f"`ssh` without a command opens a shell; {hint}")
    return _OK


def _ssh_has_command(args: list[str]) -> bool:
    i, positional = 0, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            i += 2 if arg[-1] in "BbcDEeFIiJLlmOopQRSWw" and len(arg) == 2 else 1
            continue
        positional += 1
        i += 1
    return positional >= 2


_SIMPLE_RULES: dict[str, Callable[[list[str]], BlockVerdict]] = {
    "rm": _rm,
    "git": _git,
    "kill": _kill,
    "dd": _dd,
    "chmod": lambda a: _chmod_chown("chmod", a),
    "chown": lambda a: _chmod_chown("chown", a),
    "chgrp": lambda a: _chmod_chown("chgrp", a),
}


def _redirects(simple: _Simple) -> BlockVerdict:
    for target in simple.out_targets:
        if BLOCK_DEVICE.match(target):
            return BlockVerdict("blocked", f"writing to the block device {target}")
        if target.startswith(SYSTEM_PREFIXES):
            return BlockVerdict("destructive", f"redirecting output into {target}")
    return _OK


def _check_simple(simple: _Simple, depth: int) -> BlockVerdict:
    words = list(simple.words)
    while words and (words[0] in KEYWORDS or ASSIGNMENT.match(words[0])):
        words.pop(0)
    verdicts = [_redirects(simple)]
    if not words:
        return _worst(verdicts)
    name, args = os.path.basename(words[0]), words[1:]
    if name in BLOCKED_COMMANDS:
        return BlockVerdict("blocked", f"`{name}` (privilege escalation or power control)")
    if name.startswith(BLOCKED_PREFIXES) or name in DISK_TOOLS:
        return BlockVerdict("blocked", f"`{name}` formats or repartitions disks")
    if name in WRAPPERS:
        inner = _Simple(_skip_wrapper(name, args), stdin_fed=simple.stdin_fed)
        verdicts.append(_check_simple(inner, depth + 1))
    elif name in SHELLS or name == "eval":
        script = " ".join(args) if name == "eval" else _shell_string(args)
        if script is not None:
            verdicts.append(_check(script, depth + 1))
    elif name == "find":
        verdicts.append(_find(args, depth))
    elif name in DESTRUCTIVE_COMMANDS:
        verdicts.append(BlockVerdict("destructive", f"`{name}` destroys processes or data"))
    elif name in _SIMPLE_RULES:
        verdicts.append(_SIMPLE_RULES[name](args))
    if name in {"tee", "cp", "mv"}:
        verdicts.append(_redirects(_Simple(out_targets=[a for a in args if a[:1] == "/"])))
    verdicts.append(_interactive(name, args, simple.stdin_fed))
    return _worst(verdicts)
