"""What the `bash` blocklist objects to: verdicts, rule tables and fixed rules.

`blocklist.py` finds every simple command in a command line and what it runs; this module
says what is wrong with one program and its static words (`sudo`, `mkfs`, `rm -rf /`,
`git push --force`, `dd of=/dev/sda`, editors and pagers that would wait for a human), which
inline code is harmless, and which sed and git spellings run other programs (awk's are in
`awkrules.py`). Verdicts rank blocked > interactive > destructive > ok; the worst one wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from core.seatbelt.context import HOME, basename
from core.seatbelt.gitrules import git_rules
from core.seatbelt.programargs import options, ssh_has_command
from core.seatbelt.shellexpand import Word
from core.seatbelt.verdicts import OK, BlockVerdict, worst

__all__ = [
    "OK",
    "SED_EXEC",
    "BlockVerdict",
    "deleting",
    "fixed_rules",
    "fork_loop",
    "read_only_inline",
    "write_target",
]

# --- tables ------------------------------------------------------------------------------

BLOCKED_COMMANDS = frozenset(
    {"sudo", "su", "doas", "pkexec", "runuser", "shutdown", "reboot", "halt", "poweroff",
     "telinit", "systemd-run", "nsenter"}
)  # fmt: skip
BLOCKED_PREFIXES = ("mkfs",)  # mkfs, mkfs.ext4, mkfs.vfat …
DISK_TOOLS = frozenset({"mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "parted"})
DESTRUCTIVE_COMMANDS = frozenset({"pkill", "killall", "truncate", "shred", "unlink", "wipe", "srm"})
DELETERS = frozenset({"rm", "unlink", "shred", "wipe", "srm"})
EVERYTHING = re.compile(r"(^|/)\.?\*$")  # a glob of a whole directory: `*`, `dir/*`, `.*`
# They keep a command to run later, outside this call and its sandbox's lifetime.
SCHEDULERS = frozenset({"at", "batch", "crontab"})
MULTIPLEXERS = frozenset({"tmux", "screen"})
MULTIPLEXER_LISTINGS = frozenset({"ls", "list-sessions", "list-windows", "-V", "-ls", "-list"})
EDITORS = frozenset(
    {"vi", "vim", "nvim", "view", "vimdiff", "rvim", "gvim", "nano", "emacs", "pico", "joe",
     "micro"}
)  # fmt: skip
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
# Copying one of these over a file empties or overwrites it.
EMPTY_SOURCES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
# A move to one of these takes the file out of the workspace (or destroys it).
AWAY = re.compile(r"^(/|~|\$HOME\b|\$\{HOME\}|\$TMPDIR\b|\$\{TMPDIR\}|\.\.(/|$))|/\.\.(/|$)")
# Inline code that only reports versions or paths, matched (whole) against the argv joined
# with single spaces, program name without its directory. Keep this small: each entry is a
# hole in "inline code needs an approver". (`import x` runs x's code, but so would
# `python3 x.py`, which is ok anyway.)
READ_ONLY_INLINE = tuple(
    re.compile(pattern)
    for pattern in (
        r"python[\d.]* -c import sys ?; ?print\(sys\.(version|version_info|executable|path)\);?",
        r"python[\d.]* -c import [\w.]+( ?, ?[\w.]+)*( ?; ?print\([\w.]+\.__(version|file)__\))?;?",
        r"node (-e|--eval) console\.log\(process\.versions?(\.\w+)?\);?",
        r"node (-p|--print) process\.versions?(\.\w+)?",
        r"ruby -e puts RUBY_VERSION",
        r"php -r echo PHP_VERSION;?",
    )
)
# Inline code or a program from stdin that forks in a loop is a fork bomb.
LOOP = re.compile(r"\b(while|for|loop|until)\b")
FORK = re.compile(r"\bfork\b")
# GNU sed's `e` command and the `e` flag of `s///` run shell commands.
SED_EXEC = re.compile(
    r"(^|[;\n{}])\s*(\d+|\$|/[^/\n]*/)?(\s*,\s*(\d+|\$|/[^/\n]*/))?\s*!?\s*e\b"
    r"|(^|[;\n{}\s])s([^\w\s\\])(\\.|(?!\6).)*\6(\\.|(?!\6).)*\6[a-zA-Z0-9]*e"
)
# --- fixed rules on static words ---------------------------------------------------------


def fixed_rules(name: str, args: list[str], *, stdin_fed: bool) -> BlockVerdict:
    """The verdict on running program `name` with the static words `args`."""
    if name in BLOCKED_COMMANDS:
        return BlockVerdict("blocked", f"`{name}` (privilege escalation or power control)")
    if name.startswith(BLOCKED_PREFIXES) or name in DISK_TOOLS:
        return BlockVerdict("blocked", f"`{name}` formats or repartitions disks")
    verdicts = [_interactive(name, args, stdin_fed)]
    if name.startswith("git-"):  # `/usr/lib/git-core/git-config …` is `git config …`
        verdicts.append(git_rules([name[4:], *args]))
    if name in DESTRUCTIVE_COMMANDS:
        verdicts.append(BlockVerdict("destructive", f"`{name}` destroys processes or data"))
    elif name in SCHEDULERS and not _only_lists(name, args):
        verdicts.append(BlockVerdict("destructive", f"`{name}` runs commands later, unwatched"))
    elif name in MULTIPLEXERS and not (set(args[:1]) & MULTIPLEXER_LISTINGS):
        reason = f"`{name}` runs commands in a session that outlives this call"
        verdicts.append(BlockVerdict("destructive", reason))
    elif name in _SIMPLE_RULES:
        verdicts.append(_SIMPLE_RULES[name](args))
    if name in {"tee", "cp", "mv"}:
        verdicts += [write_target(a) for a in args if a[:1] == "/"]
    return worst(verdicts)


def deleting(name: str, args: list[Word]) -> BlockVerdict:
    """`rm` and kin given names no one can read before they run: the names `find -exec`,
    `xargs` or a substitution produce, or a glob of everything (`rm *`, `rm dir/*`)."""
    if name not in DELETERS:
        return OK
    for word in args:
        if word.text.startswith("-"):
            continue
        if word.substituted:
            reason = f"`{name}` deletes files whose names another command produces"
            return BlockVerdict("destructive", f"{reason} ({word.dynamic})")
        if word.dynamic and EVERYTHING.search(word.text):
            return BlockVerdict("destructive", f"`{name} {word.text}` deletes every file there")
    return OK


def write_target(target: str) -> BlockVerdict:
    """The verdict on writing into `target` (a redirect, or `tee`/`cp`/`mv`)."""
    if BLOCK_DEVICE.match(target):
        return BlockVerdict("blocked", f"writing to the block device {target}")
    if target.startswith(SYSTEM_PREFIXES):
        return BlockVerdict("destructive", f"redirecting output into {target}")
    return OK


def fork_loop(code: str) -> BlockVerdict:
    """Blocked when inline code or a program from stdin forks in a loop."""
    if FORK.search(code) and LOOP.search(code):
        return BlockVerdict("blocked", "a fork bomb (fork() in a loop)")
    return OK


def read_only_inline(argv: list[Word]) -> bool:
    """Whether an interpreter's argv is one of the `READ_ONLY_INLINE` one-liners."""
    if any(w.dynamic for w in argv):
        return False
    joined = " ".join([basename(argv[0].text), *(w.text for w in argv[1:])])
    normalized = " ".join(joined.split())
    return any(pattern.fullmatch(normalized) for pattern in READ_ONLY_INLINE)


def _is_critical(target: str) -> bool:
    if not target:
        return False
    stripped = re.sub(r"(/\.?|/\*)+$", "", target.replace("//", "/")) or "/"
    home = HOME.get()
    return stripped in CRITICAL_TARGETS or stripped in {home or "~/", "~/", "$HOME/"}


def _rm(args: list[str]) -> BlockVerdict:
    opts, targets = options(args)
    recursive = bool(opts & {"-r", "-R", "--recursive"})
    forced = bool(opts & {"-f", "--force"})
    if "--no-preserve-root" in opts or ((recursive or forced) and any(map(_is_critical, targets))):
        return BlockVerdict("blocked", "`rm` of the root or home directory")
    if recursive or forced:
        return BlockVerdict("destructive", "a recursive or forced delete (`rm -r`/`rm -f`)")
    return OK


def _chmod_chown(name: str, args: list[str]) -> BlockVerdict:
    opts, operands = options(args)
    recursive = bool(opts & {"-R", "--recursive"})
    world = name == "chmod" and any(re.fullmatch(r"0?777|a\+rwx", a) for a in operands)
    if (recursive or world) and any(map(_is_critical, operands[1:])):
        return BlockVerdict("blocked", f"`{name}` on the root or home directory")
    if world:
        return BlockVerdict("destructive", "`chmod 777` makes files writable by everyone")
    if recursive and name != "chmod":
        return BlockVerdict("destructive", f"a recursive `{name}`")
    return OK


def _only_lists(name: str, args: list[str]) -> bool:
    """`crontab -l`, `at -l`: only show what is scheduled."""
    return "-l" in args


def _mv(args: list[str]) -> BlockVerdict:
    opts, operands = options(args)
    targets = [a.split("=", 1)[1] for a in args if a.startswith("--target-directory=")]
    targets += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-t"]
    if not targets and "-t" not in opts:
        targets = operands[-1:] if len(operands) > 1 else []
    for target in targets:
        if target.startswith("/dev/"):
            return BlockVerdict("destructive", f"`mv` into {target} destroys the file")
        if AWAY.search(target):
            return BlockVerdict("destructive", f"`mv` to {target} takes files out of the workspace")
    return OK


def _ln(args: list[str]) -> BlockVerdict:
    opts, _ = options(args)
    if opts & {"-f", "--force"}:
        return BlockVerdict("destructive", "`ln -f` replaces the file at the link's name")
    return OK


def _cp(args: list[str]) -> BlockVerdict:
    _, operands = options(args)
    if len(operands) > 1 and operands[0] in EMPTY_SOURCES:
        return BlockVerdict("destructive", f"copying {operands[0]} over a file destroys it")
    return OK


def _fallocate(args: list[str]) -> BlockVerdict:
    opts, _ = options(args)
    if opts & {"-p", "-c", "-z", "--punch-hole", "--collapse-range", "--zero-range"}:
        return BlockVerdict("destructive", "`fallocate` that removes or zeroes file data")
    return OK


def _kill(args: list[str]) -> BlockVerdict:
    joined = " ".join(args)
    if re.search(r"(^|\s)-(9|KILL|SIGKILL)\b|-s\s+(9|KILL|SIGKILL)\b", joined):
        return BlockVerdict("destructive", "`kill -9` cannot be caught or cleaned up after")
    return OK


def _dd(args: list[str]) -> BlockVerdict:
    for arg in args:
        target = arg[3:]
        if not arg.startswith("of=") or target in SAFE_DEVICES or target.startswith("/dev/fd/"):
            continue
        if target.startswith("/dev/"):
            return BlockVerdict("blocked", "`dd` writing to a device")
        return BlockVerdict("destructive", f"`dd of={target}` overwrites the file in place")
    return OK


def _interactive(name: str, args: list[str], stdin_fed: bool) -> BlockVerdict:
    if name in EDITORS and not {"--batch", "-batch", "--headless", "-es", "-Es"} & set(args):
        hint = "write files with write_file, or edit with `sed -i`"
        return BlockVerdict("interactive", f"`{name}` is an interactive editor; {hint}")
    if name in PAGERS:
        hint = "use `cat`, `head`, `tail` or read_file with offset/limit"
        return BlockVerdict("interactive", f"`{name}` is a pager; {hint}")
    if name in MONITORS and not (name == "top" and "-b" in options(args)[0]):
        hint = "use a one-shot form such as `ps aux` or `top -b -n 1`"
        return BlockVerdict("interactive", f"`{name}` runs until stopped; {hint}")
    is_repl = name in REPLS or re.fullmatch(r"python3(\.\d+)?", name)
    # A REPL fed through a pipe or `<<EOF` runs that script; only a bare one would sit idle.
    if is_repl and not stdin_fed and all(a in REPL_PASSIVE_FLAGS for a in args):
        hint = "pass a script file"
        return BlockVerdict("interactive", f"bare `{name}` starts a REPL; {hint}")
    if name == "ssh" and not stdin_fed and not ssh_has_command(args):
        hint = "add the remote command, e.g. `ssh host 'uptime'`"
        return BlockVerdict("interactive", f"`ssh` without a command opens a shell; {hint}")
    return OK


_SIMPLE_RULES: dict[str, Callable[[list[str]], BlockVerdict]] = {
    "rm": _rm,
    "git": git_rules,
    "mv": _mv,
    "ln": _ln,
    "cp": _cp,
    "install": _cp,
    "fallocate": _fallocate,
    "kill": _kill,
    "dd": _dd,
    "chmod": lambda a: _chmod_chown("chmod", a),
    "chown": lambda a: _chmod_chown("chown", a),
    "chgrp": lambda a: _chmod_chown("chgrp", a),
}
