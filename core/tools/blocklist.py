"""Dangerous-command checks for `bash` (SPEC §4, §13): defence in depth, not the wall.

This is a seatbelt. The wall is the kernel sandbox (`sandbox.py`, `landlock.py`): whatever
slips past these checks still runs confined. The checks exist to stop the obvious accidents
before they run and to put a human approver in front of anything Parley cannot read.

Parsing: the command line is parsed once with tree-sitter and the `tree-sitter-bash`
grammar (see `shellparse.py`). It is maintained by the tree-sitter organisation, ships
precompiled wheels, and parses error-tolerantly with explicit ERROR/MISSING nodes, so a line
it does not understand is flagged instead of guessed at. (bashlex, the usual alternative,
has been unmaintained since 2023 and rejects constructs it does not know.) Every simple
command anywhere in the tree is judged: in lists, pipelines, subshells, `$( )`, `<( )`,
function bodies, `if`/`while`/`for`/`case`, `sh -c` strings, `eval` text and through
wrappers (`env`, `nohup`, `timeout`, `xargs`, `find -exec` …). The worst verdict wins:
blocked > interactive > destructive > ok.

Approvals fail closed: a command is at least "destructive" (a human must approve) when
Parley cannot read what will run: a parse problem; a program name computed at run time
(`$R`, `$(…)`, backticks, `{a,b}`, `$'…'`, globs); `eval`, `source`, `alias`, `trap`; a
call to a shell function; a shell or interpreter reading its program from a pipe or heredoc;
inline interpreter code (`python3 -c`, `perl -e`, `node -e` …) outside the small
`READ_ONLY_INLINE` table. Values that are statically knowable on the same line are still
looked through (`R=rm; $R -rf /`, `{rm,-rf,/}`, `$(echo rm) -rf /` are blocked).
Heredoc bodies are data unless a shell or interpreter reads them, and then they are code.
A plain `rm file` (no -r/-f) stays "ok": deleting single files in the workspace is routine,
and the filesystem walls and the `write` category already apply.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from tree_sitter import Node

from core.tools import shellparse as sh
from core.tools.shellparse import Word

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
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "fish"})
# Leading words that do not name the command: shell keywords and group braces.
KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                      "while", "until", "case", "esac", "function"})  # fmt: skip
# Setting these makes the shell run their value as code later (`PS4` under `set -x` …).
CODE_VARIABLES = frozenset({"PS4", "PROMPT_COMMAND", "BASH_ENV", "ENV"})
# `x='a[$(cmd)]'; echo $((x))` runs cmd: arithmetic evaluates array subscripts.
ARITHMETIC_INJECTION = re.compile(r"\[[^\]]*(\$\(|`)")
# Builtins that assign variables at run time: forget what we knew about their operands.
ASSIGNING_BUILTINS = frozenset({"read", "mapfile", "readarray", "getopts", "let", "printf"})


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
# awk programs that run commands: system(), `print | "cmd"`, `"cmd" | getline`, `|&`.
AWK_RUNS = re.compile(
    r"\bsystem\s*\(|\|&|(?<!\|)\|(?!\|)\s*(getline\b|\"|[A-Za-z_]\w*\s*($|[;}\n)]))"
)
# GNU sed's `e` command and the `e` flag of `s///` run shell commands.
SED_EXEC = re.compile(
    r"(^|[;\n{}])\s*(\d+|\$|/[^/\n]*/)?(\s*,\s*(\d+|\$|/[^/\n]*/))?\s*!?\s*e\b"
    r"|(^|[;\n{}\s])s([^\w\s\\])(\\.|(?!\6).)*\6(\\.|(?!\6).)*\6[a-zA-Z0-9]*e"
)
# `git -c` settings that make git run a program (a sample, not a complete list).
GIT_RUNNING_CONFIG = re.compile(
    r"(?i)(alias\.[^=]*=\s*!|core\.(pager|editor|sshcommand|fsmonitor|hookspath)=|"
    r"[^=]*\.(command|cmd|program|textconv|helper|clean|smudge|process)=)"
)
_MAX_DEPTH = 8

_RANK: dict[VerdictKind, int] = {"ok": 0, "destructive": 1, "interactive": 2, "blocked": 3}
_UNREADABLE = "Parley cannot check it, so an approver must"


@dataclass(frozen=True, slots=True)
class BlockVerdict:
    """How `bash` must treat a command, and why (phrased for the model)."""

    kind: VerdictKind
    reason: str = ""


_OK = BlockVerdict("ok")


def _worst(verdicts: list[BlockVerdict]) -> BlockVerdict:
    return max(verdicts, key=lambda v: _RANK[v.kind], default=_OK)


def _unreadable(what: str) -> BlockVerdict:
    """Parley cannot tell what `what` runs: fail closed, and let an approver decide."""
    return BlockVerdict("destructive", f"{what}; {_UNREADABLE}")


@dataclass(frozen=True, slots=True)
class _Stdin:
    source: Literal["none", "file", "code"] = "none"  # "code": a pipe, heredoc or here-string
    text: str | None = None  # what arrives there, when it is known statically


_NO_STDIN = _Stdin()


@dataclass(slots=True)
class _Ctx:
    functions: frozenset[str]
    depth: int = 0
    env: dict[str, str] = field(default_factory=dict)  # variables with a static value
    verdicts: list[BlockVerdict] = field(default_factory=list)

    def add(self, kind: VerdictKind, reason: str) -> None:
        self.verdicts.append(BlockVerdict(kind, reason))

    def unreadable(self, what: str) -> None:
        self.verdicts.append(_unreadable(what))

    def fork(self) -> _Ctx:
        """A subshell: assignments inside do not leak out; verdicts are shared."""
        return _Ctx(self.functions, self.depth, dict(self.env), self.verdicts)


# --- entry point -------------------------------------------------------------------------


def check_command(command: str) -> BlockVerdict:
    """Classify a `bash` command string; never raises."""
    try:
        return _check_text(command, 0)
    except RecursionError:
        return _unreadable("the command is nested too deeply")
    except Exception as exc:  # a bug here must not let the command through unasked
        return BlockVerdict("destructive", f"the command could not be checked ({exc!r})")


def _check_text(source: str, depth: int) -> BlockVerdict:
    if depth > _MAX_DEPTH:
        return _unreadable("commands nested too deeply")
    trees, problem = sh.parse_readings(source)
    verdicts = [_unreadable(f"the command could not be parsed ({problem})")] if problem else []
    for tree in trees:  # every reading is judged and the worst verdict wins
        _walk(tree.root, _Ctx(tree.functions, depth, verdicts=verdicts), _NO_STDIN)
    return _worst(verdicts)


# --- walking the tree --------------------------------------------------------------------


def _walk(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    handler = _HANDLERS.get(node.type)
    if handler is not None:
        handler(node, ctx, stdin)
        return
    for child in node.named_children:
        _walk(child, ctx, stdin)


def _subshell(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    inner = ctx.fork()
    for child in node.named_children:
        _walk(child, inner, stdin)


def _pipeline(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    # `cat <<EOF | sh`: tree-sitter nests the rest of the pipeline, `|` first, in the heredoc.
    if node.child_count and not node.children[0].is_named:
        stdin = _Stdin("code")
    for child in node.named_children:
        _walk(child, ctx.fork(), stdin)
        stdin = _Stdin(
            "code", sh.static_output(child, ctx.env) if child.type == "command" else None
        )


def _command(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    argv: list[Word] = []
    redirects: list[Node] = []
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assign(child, ctx, persist=False)
        elif child.type.endswith("_redirect"):
            redirects.append(child)
        elif child.type != "comment":
            argv += sh.expand(child, ctx.env)
            _walk(child, ctx, stdin)  # commands inside substitutions are judged on their own
    _apply_redirects(redirects, ctx, stdin, lambda s: _judge(argv, ctx, s, ctx.depth))


def _redirected(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    body = node.child_by_field_name("body")
    redirects = [c for c in node.named_children if c.type.endswith("_redirect")]
    for child in node.named_children:
        if child != body and child not in redirects:
            _walk(child, ctx, stdin)
    _apply_redirects(redirects, ctx, stdin, lambda s: None if body is None else _walk(body, ctx, s))


def _apply_redirects(
    redirects: list[Node], ctx: _Ctx, stdin: _Stdin, run: Callable[[_Stdin], object]
) -> None:
    """Work out the statement's stdin, judge it with `run`, then check the redirects."""
    for redirect in redirects:
        stdin = _stdin_from(redirect, ctx, stdin)
    run(stdin)
    for redirect in redirects:
        _check_redirect(redirect, ctx, stdin)


def _stdin_from(node: Node, ctx: _Ctx, stdin: _Stdin) -> _Stdin:
    if node.type == "heredoc_redirect":
        body = next((c for c in node.named_children if c.type == "heredoc_body"), None)
        return _Stdin("code", None if body is None else sh.text(body))
    if node.type == "herestring_redirect":
        words = [w for c in node.named_children for w in sh.expand(c, ctx.env)]
        known = all(w.known for w in words)
        return _Stdin("code", " ".join(w.text for w in words) + "\n" if known else None)
    descriptor = node.child_by_field_name("descriptor")
    operators = "".join(c.type for c in node.children if not c.is_named)
    if (
        "<" in operators
        and ">" not in operators
        and (descriptor is None or sh.text(descriptor) == "0")
    ):
        return _Stdin("file")
    return stdin


def _check_redirect(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    operators = "".join(c.type for c in node.children if not c.is_named)
    for child in node.named_children:
        if child.type in {"heredoc_start", "heredoc_end", "file_descriptor"}:
            continue
        if child.type.endswith("_redirect"):  # `python3 - <<EOF > out.txt`
            _check_redirect(child, ctx, stdin)
        elif child.type in {"heredoc_body"} or node.type != "heredoc_redirect":
            _walk(child, ctx, stdin)  # substitutions in targets and unquoted bodies run
            if ">" in operators and node.type == "file_redirect":
                ctx.verdicts += [_target(w.text) for w in sh.expand(child, ctx.env)]
        else:  # statements after the heredoc operator: `&& cmd`, `| sh`
            _walk(child, ctx, _NO_STDIN)


def _target(target: str) -> BlockVerdict:
    if BLOCK_DEVICE.match(target):
        return BlockVerdict("blocked", f"writing to the block device {target}")
    if target.startswith(SYSTEM_PREFIXES):
        return BlockVerdict("destructive", f"redirecting output into {target}")
    return _OK


def _assign(node: Node, ctx: _Ctx, *, persist: bool = True) -> None:
    name_node, value = node.child_by_field_name("name"), node.child_by_field_name("value")
    name = sh.text(name_node) if name_node is not None else ""
    if name in CODE_VARIABLES:
        ctx.unreadable(f"setting {name}, which the shell later runs as code")
    for part in (name_node, value):  # `x[$(cmd)]=…` runs cmd too
        if part is not None:
            _walk(part, ctx, _NO_STDIN)
    words = sh.expand(value, ctx.env) if value is not None else [Word("")]
    if any(ARITHMETIC_INJECTION.search(w.text) for w in words):
        ctx.unreadable(f"`{name}` holds `[$(…)]`, which arithmetic on it would run")
    if not persist:
        return
    appended = any(c.type == "+=" for c in node.children)
    if appended or len(words) != 1 or not words[0].known or len(words[0].text) > sh.MAX_VALUE:
        ctx.env.pop(name, None)
    else:
        ctx.env[name] = words[0].text


def _declaration(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assign(child, ctx)
        elif child.type == "variable_name" or node.type == "unset_command":
            ctx.env.pop(sh.text(child), None)
            _walk(child, ctx, stdin)
        else:
            _walk(child, ctx, stdin)


def _for(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    variable = node.child_by_field_name("variable")
    if variable is not None:
        ctx.env.pop(sh.text(variable), None)
    for child in node.named_children:
        _walk(child, ctx, stdin)


def _function(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    name_node, body = node.child_by_field_name("name"), node.child_by_field_name("body")
    name = sh.text(name_node) if name_node is not None else ""
    calls, stack = 0, [] if body is None else [body]
    while stack:
        current = stack.pop()
        called = current.child_by_field_name("name") if current.type == "command" else None
        calls += called is not None and sh.text(called) == name
        stack.extend(current.named_children)
    if calls >= 2:
        ctx.add("blocked", f"a fork bomb (the function `{name}` calls itself more than once)")
    for child in node.named_children:  # the body, and redirects applied at each call
        if child != name_node:
            _walk(child, ctx.fork(), _NO_STDIN)


_HANDLERS: dict[str, Callable[[Node, _Ctx, _Stdin], None]] = {
    "command": _command,
    "pipeline": _pipeline,
    "redirected_statement": _redirected,
    "subshell": _subshell,
    "command_substitution": _subshell,
    "process_substitution": _subshell,
    "variable_assignment": lambda node, ctx, stdin: _assign(node, ctx),
    "declaration_command": _declaration,
    "unset_command": _declaration,
    "for_statement": _for,
    "function_definition": _function,
    "file_redirect": _check_redirect,
    "heredoc_redirect": _check_redirect,
    "herestring_redirect": _check_redirect,
}


# --- judging one simple command ------------------------------------------------------------


def _judge(argv: list[Word], ctx: _Ctx, stdin: _Stdin, depth: int) -> None:
    while argv and argv[0].text in KEYWORDS:  # `time { cmd; }`: tree-sitter reads `{` as a word
        argv = argv[1:]
    if not argv:
        return
    if depth > _MAX_DEPTH:
        ctx.unreadable("commands nested too deeply")
        return
    head, args = argv[0], argv[1:]
    if head.dynamic:
        ctx.unreadable(f"the program name is computed at run time ({head.dynamic})")
    if head.text in ctx.functions:
        ctx.unreadable(f"calls the shell function `{head.text}`, whose arguments steer it")
    name = os.path.basename(head.text)
    words = [a.text for a in args]
    ctx.verdicts.append(_fixed_rules(name, words, stdin))
    if name in ASSIGNING_BUILTINS:
        for word in words:
            ctx.env.pop(word, None)
    interpreter = sh.interpreter_for(name)
    if name in sh.WRAPPERS:
        inner = sh.unwrap(name, args)
        if name == "exec" and not inner and stdin.source == "code":
            ctx.unreadable("`exec <<<`/`exec <<EOF` feeds that text to every later command")
        _judge(inner, ctx, stdin, depth + 1)
    elif name in SHELLS:
        _shell(name, args, ctx, stdin, depth)
    elif name in {"awk", "gawk", "mawk", "nawk"}:
        _awk(name, args, ctx, stdin)
    elif interpreter is not None:
        _interpreter(name, interpreter, argv, ctx, stdin)
    elif name == "find":
        _find(args, ctx, depth)
    else:
        _code_builtin(name, args, ctx, depth)


def _fixed_rules(name: str, args: list[str], stdin: _Stdin) -> BlockVerdict:
    if name in BLOCKED_COMMANDS:
        return BlockVerdict("blocked", f"`{name}` (privilege escalation or power control)")
    if name.startswith(BLOCKED_PREFIXES) or name in DISK_TOOLS:
        return BlockVerdict("blocked", f"`{name}` formats or repartitions disks")
    verdicts = [_interactive(name, args, stdin.source != "none")]
    if name in DESTRUCTIVE_COMMANDS:
        verdicts.append(BlockVerdict("destructive", f"`{name}` destroys processes or data"))
    elif name in _SIMPLE_RULES:
        verdicts.append(_SIMPLE_RULES[name](args))
    if name in {"tee", "cp", "mv"}:
        verdicts += [_target(a) for a in args if a[:1] == "/"]
    return _worst(verdicts)


def _code_builtin(name: str, args: list[Word], ctx: _Ctx, depth: int) -> None:
    """Builtins that run text as code or change what a command name means."""
    words = [a.text for a in args]
    if name == "eval" and args:
        ctx.unreadable("`eval` runs text as a command")
        ctx.verdicts.append(_check_text(" ".join(words), depth + 1))
    elif name in {"source", "."} and args:
        ctx.unreadable(f"`{name}` runs a script file in this shell")
    elif name == "alias" and any("=" in w for w in words):
        ctx.unreadable("an alias changes what a command name runs")
        ctx.verdicts += [_check_text(w.split("=", 1)[1], depth + 1) for w in words if "=" in w]
    elif name == "trap" and words and words[0] not in {"-l", "-p", "-"}:
        ctx.unreadable("`trap` runs a command when a signal arrives")
        ctx.verdicts.append(_check_text(words[0], depth + 1))
    elif (name == "hash" and "-p" in words) or (name in {"mapfile", "readarray"} and "-C" in words):
        ctx.unreadable(f"`{name} {'-p' if name == 'hash' else '-C'}` runs code chosen at run time")
    elif name == "enable" and any(w.startswith("-") and "f" in w for w in words):
        ctx.unreadable("`enable -f` loads a builtin from a shared library")
    elif name == "sed" and any(SED_EXEC.search(w) for w in sh.sed_scripts(words)):
        ctx.unreadable("the GNU sed `e` command runs shell commands")


def _shell(name: str, args: list[Word], ctx: _Ctx, stdin: _Stdin, depth: int) -> None:
    script, from_stdin, operands = sh.shell_args(args)
    if script is not None:
        if script.dynamic:
            ctx.unreadable(f"the script of `{name} -c` is computed at run time ({script.dynamic})")
        ctx.verdicts.append(_check_text(script.text, depth + 1))
    elif from_stdin:
        _stdin_program(name, ctx, stdin, lambda code: _check_text(code, depth + 1))
    elif operands[0].substituted:
        ctx.unreadable(
            f"`{name}` runs a script produced by another command ({operands[0].dynamic})"
        )


def _stdin_program(
    name: str, ctx: _Ctx, stdin: _Stdin, judge: Callable[[str], BlockVerdict]
) -> None:
    if stdin.source != "code":
        return  # a script file (`sh < run.sh`) is like `sh run.sh`; a closed stdin runs nothing
    ctx.unreadable(f"`{name}` reads its program from a pipe, here-string or heredoc")
    if stdin.text is not None:
        ctx.verdicts.append(judge(stdin.text))


def _fork_loop(code: str) -> BlockVerdict:
    if FORK.search(code) and LOOP.search(code):
        return BlockVerdict("blocked", "a fork bomb (fork() in a loop)")
    return _OK


def _interpreter(
    name: str, spec: sh.Interpreter, argv: list[Word], ctx: _Ctx, stdin: _Stdin
) -> None:
    code, operands, has_program = sh.interpreter_args(spec, argv[1:])
    if code is None and operands and operands[0].text in spec.subcommands:
        code = operands[1] if len(operands) > 1 else Word("")
    if code is not None:
        if code.dynamic or not _read_only(argv):
            ctx.unreadable(f"`{name}` runs inline code ({sh.short(code.text)})")
            ctx.verdicts.append(_fork_loop(code.text))
    elif not has_program and (not operands or operands[0].text in sh.STDIN_PATHS):
        _stdin_program(name, ctx, stdin, _fork_loop)
    elif not has_program and operands[0].substituted:
        ctx.unreadable(
            f"`{name}` runs a program produced by another command ({operands[0].dynamic})"
        )


def _read_only(argv: list[Word]) -> bool:
    if any(w.dynamic for w in argv):
        return False
    joined = " ".join([os.path.basename(argv[0].text), *(w.text for w in argv[1:])])
    normalized = " ".join(joined.split())
    return any(pattern.fullmatch(normalized) for pattern in READ_ONLY_INLINE)


def _awk(name: str, args: list[Word], ctx: _Ctx, stdin: _Stdin) -> None:
    program, file_from_stdin = sh.awk_program(args)
    if file_from_stdin:
        _stdin_program(name, ctx, stdin, lambda _: _OK)
    elif program is not None and program.dynamic:
        ctx.unreadable(f"the `{name}` program is computed at run time")
    elif program is not None and AWK_RUNS.search(program.text):
        ctx.unreadable(f"the `{name}` program runs commands")


def _find(args: list[Word], ctx: _Ctx, depth: int) -> None:
    words = [a.text for a in args]
    if "-delete" in words:
        ctx.add("destructive", "`find -delete`")
    for i, word in enumerate(words):
        if word in {"-exec", "-execdir", "-ok", "-okdir"}:
            inner: list[Word] = []
            for arg in args[i + 1 :]:
                if arg.text in {";", "+"}:
                    break
                found = "the file names `find` passes"
                inner.append(Word(arg.text, found, known=False) if "{}" in arg.text else arg)
            _judge(inner, ctx, _NO_STDIN, depth + 1)


# --- fixed rules on static words ---------------------------------------------------------


def _is_critical(target: str) -> bool:
    if not target:
        return False
    stripped = re.sub(r"(/\.?|/\*)+$", "", target.replace("//", "/")) or "/"
    home = os.path.expanduser("~")
    return stripped in CRITICAL_TARGETS or stripped in {home, "~/", "$HOME/"}


def _rm(args: list[str]) -> BlockVerdict:
    opts, targets = sh.options(args)
    recursive = bool(opts & {"-r", "-R", "--recursive"})
    forced = bool(opts & {"-f", "--force"})
    if "--no-preserve-root" in opts or ((recursive or forced) and any(map(_is_critical, targets))):
        return BlockVerdict("blocked", "`rm` of the root or home directory")
    if recursive or forced:
        return BlockVerdict("destructive", "a recursive or forced delete (`rm -r`/`rm -f`)")
    return _OK


def _chmod_chown(name: str, args: list[str]) -> BlockVerdict:
    opts, operands = sh.options(args)
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
        if args[0] == "-c" and len(args) > 1 and GIT_RUNNING_CONFIG.match(args[1]):
            return _unreadable(f"`git -c {args[1]}` runs a program")
        args = args[2:] if args[0] in {"-C", "-c"} else args[1:]
    if not args:
        return _OK
    sub, rest = args[0], args[1:]
    opts, operands = sh.options(rest)
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


def _interactive(name: str, args: list[str], stdin_fed: bool) -> BlockVerdict:
    if name in EDITORS and not {"--batch", "-batch", "--headless", "-es", "-Es"} & set(args):
        hint = "write files with write_file, or edit with `sed -i`"
        return BlockVerdict("interactive", f"`{name}` is an interactive editor; {hint}")
    if name in PAGERS:
        hint = "use `cat`, `head`, `tail` or read_file with offset/limit"
        return BlockVerdict("interactive", f"`{name}` is a pager; {hint}")
    if name in MONITORS and not (name == "top" and "-b" in sh.options(args)[0]):
        hint = "use a one-shot form such as `ps aux` or `top -b -n 1`"
        return BlockVerdict("interactive", f"`{name}` runs until stopped; {hint}")
    is_repl = name in REPLS or re.fullmatch(r"python3(\.\d+)?", name)
    # A REPL fed through a pipe or `<<EOF` runs that script; only a bare one would sit idle.
    if is_repl and not stdin_fed and all(a in REPL_PASSIVE_FLAGS for a in args):
        hint = "pass a script file"
        return BlockVerdict("interactive", f"bare `{name}` starts a REPL; {hint}")
    if name == "ssh" and not stdin_fed and not sh.ssh_has_command(args):
        hint = "add the remote command, e.g. `ssh host 'uptime'`"
        return BlockVerdict("interactive", f"`ssh` without a command opens a shell; {hint}")
    return _OK


_SIMPLE_RULES: dict[str, Callable[[list[str]], BlockVerdict]] = {
    "rm": _rm,
    "git": _git,
    "kill": _kill,
    "dd": _dd,
    "chmod": lambda a: _chmod_chown("chmod", a),
    "chown": lambda a: _chmod_chown("chown", a),
    "chgrp": lambda a: _chmod_chown("chgrp", a),
}
