"""Dangerous-command checks for `bash` (docs/tools.md): defence in depth, not the wall.

This is a seatbelt. The wall is the kernel sandbox (`jail.py`, `landlock.py`): whatever
slips past these checks still runs confined. The checks exist to stop the obvious accidents
before they run and to put a human approver in front of anything Parley cannot read.

Parsing: the command line is parsed once with tree-sitter and the `tree-sitter-bash`
grammar (see `shellparse.py`). It is maintained by the tree-sitter organisation, ships
precompiled wheels, and parses error-tolerantly with explicit ERROR/MISSING nodes, so a line
it does not understand is flagged instead of guessed at. (bashlex, the usual alternative,
has been unmaintained since 2023 and rejects constructs it does not know.) Every simple
command anywhere in the tree is judged: in lists, pipelines, subshells, `$( )`, `<( )`,
function bodies, `if`/`while`/`for`/`case`, `sh -c` strings, `eval` text and through
wrappers (`env`, `nice`, `chrt`, `flock`, `xargs`, `parallel`, `find -exec` …). The worst
verdict wins: blocked > interactive > destructive > ok.

This module finds every simple command and what it runs; what its words expand to is in
`shellexpand.py`, how programs take their arguments in `programargs.py` and `wrappers.py`,
and the rules on one program's static words in `commandrules.py` (blocked programs,
deletion, including without `rm`), `coderules.py` (code given in an option or a variable),
`awkrules.py` (awk programs that run commands) and `gitrules.py`.

Approvals fail closed: a command is at least "destructive" (a human must approve) when
Parley cannot read what will run: a parse problem; a program name computed at run time
(`$R`, `$(…)`, backticks, `{a,b}`, `$'…'`, globs); `eval`, `source`, `alias`, `trap`; a
call to a shell function; a shell or interpreter reading its program from a pipe or heredoc;
inline interpreter code (`python3 -c`, `perl -e`, `node -e` …) outside the small
`commandrules.READ_ONLY_INLINE` table; any known program given code in an option
(`make --eval`, `gdb -ex`, `tar --to-command`, `git -c`); a wrapper option Parley does not
know. Values that are statically knowable on the same
line are still looked through (`R=rm; $R -rf /`, `{rm,-rf,/}`, `$(echo rm) -rf /` are
blocked).
Heredoc bodies are data unless a shell or interpreter reads them, and then they are code.
A plain `rm file` (no -r/-f) stays "ok": deleting single files in the workspace is routine,
and the filesystem walls and the `write` category already apply; so do its equals, a
redirect that truncates a file (`: > f`) and `mv a b` over an existing `b`. What no text
check sees is what a script file the model wrote does when it runs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import field
from typing import Literal

from tree_sitter import Node

from core.records import record
from core.seatbelt.awkrules import awk_args, awk_text, awk_verdict
from core.seatbelt.coderules import code_rules, code_variable, code_variables
from core.seatbelt.commandrules import (
    SED_EXEC,
    deleting,
    fixed_rules,
    fork_loop,
    read_only_inline,
    write_target,
)
from core.seatbelt.context import HOME, basename
from core.seatbelt.programargs import (
    SHELL_OPTIONS,
    STDIN_PATHS,
    Interpreter,
    interpreter_args,
    interpreter_for,
    option_value,
    sed_scripts,
    shell_args,
)
from core.seatbelt.shellexpand import MAX_VALUE, Word, expand, static_output
from core.seatbelt.shellparse import parse_readings, short, text
from core.seatbelt.verdicts import BlockVerdict, VerdictKind, unreadable, worst
from core.seatbelt.wrappers import WRAPPERS, unwrap

# --- tables ------------------------------------------------------------------------------

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "fish"})
# Leading words that do not name the command: shell keywords and group braces.
KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                      "while", "until", "case", "esac", "function"})  # fmt: skip
# `x='a[$(cmd)]'; echo $((x))` runs cmd: arithmetic evaluates array subscripts.
ARITHMETIC_INJECTION = re.compile(r"\[[^\]]*(\$\(|`)")
# `${NAME:=value}` assigns NAME while it expands.
DEFAULT_ASSIGNMENT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?=")
# Builtins that assign variables at run time: forget what we knew about their operands.
ASSIGNING_BUILTINS = frozenset({"read", "mapfile", "readarray", "getopts", "let", "printf"})
# A deleting command somewhere in a script.
DELETES = re.compile(r"(^|[\s;&|(`])(rm|unlink|shred)\s")
_MAX_DEPTH = 8


@record(frozen=True, slots=True)
class _Stdin:
    source: Literal["none", "file", "code"] = "none"  # "code": a pipe, heredoc or here-string
    text: str | None = None  # what arrives there, when it is known statically


_NO_STDIN = _Stdin()


@record(slots=True)
class _Ctx:
    functions: frozenset[str]
    depth: int = 0
    env: dict[str, str] = field(default_factory=dict)  # variables with a static value
    verdicts: list[BlockVerdict] = field(default_factory=list)

    def add(self, kind: VerdictKind, reason: str) -> None:
        self.verdicts.append(BlockVerdict(kind, reason))

    def unreadable(self, what: str) -> None:
        self.verdicts.append(unreadable(what))

    def fork(self) -> _Ctx:
        """A subshell: assignments inside do not leak out; verdicts are shared."""
        return _Ctx(self.functions, self.depth, dict(self.env), self.verdicts)


# --- entry point -------------------------------------------------------------------------


CACHED_CHARS = 64 * 1024  # longer commands are checked afresh each time


def check_command(command: str, home: str = "") -> BlockVerdict:
    """Classify a `bash` command string; never raises. `home`: the tools' user's home
    directory as a path (`rm -rf` of it is blocked like `rm -rf ~`; the caller reads it:
    the seatbelt does no I/O). The verdict on a command is kept for the next asker: a
    `bash` call is checked for its category, then again as it runs."""
    if len(command) > CACHED_CHARS:
        return _cached_check.__wrapped__(command, home)
    return _cached_check(command, home)


@functools.lru_cache(maxsize=64)
def _cached_check(command: str, home: str) -> BlockVerdict:
    """`home` is part of the key: whether `rm -rf /home/me` is blocked depends on it."""
    token = HOME.set(home)
    try:
        return _check(command)
    finally:
        HOME.reset(token)


def _check(command: str) -> BlockVerdict:
    try:
        return _check_text(command, 0)
    except RecursionError:
        return unreadable("the command is nested too deeply")
    except Exception as exc:  # a bug here must not let the command through unasked
        return BlockVerdict("destructive", f"the command could not be checked ({exc!r})")


def _check_text(source: str, depth: int) -> BlockVerdict:
    if depth > _MAX_DEPTH:
        return unreadable("commands nested too deeply")
    trees, problem = parse_readings(source)
    verdicts = [unreadable(f"the command could not be parsed ({problem})")] if problem else []
    verdicts += [code_variable(m.group(1), ["?"]) for m in DEFAULT_ASSIGNMENT.finditer(source)]
    for tree in trees:  # every reading is judged and the worst verdict wins
        _walk(tree.root, _Ctx(tree.functions, depth, verdicts=verdicts), _NO_STDIN)
    return worst(verdicts)


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
        stdin = _Stdin("code", static_output(child, ctx.env) if child.type == "command" else None)


def _command(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    argv: list[Word] = []
    redirects: list[Node] = []
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assign(child, ctx, persist=False)
        elif child.type.endswith("_redirect"):
            redirects.append(child)
        elif child.type != "comment":
            argv += expand(child, ctx.env)
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
        return _Stdin("code", _heredoc_text(node))
    if node.type == "herestring_redirect":
        words = [w for c in node.named_children for w in expand(c, ctx.env)]
        known = all(w.known for w in words)
        return _Stdin("code", " ".join(w.text for w in words) + "\n" if known else None)
    descriptor = node.child_by_field_name("descriptor")
    operators = "".join(c.type for c in node.children if not c.is_named)
    if (
        "<" in operators
        and ">" not in operators
        and (descriptor is None or text(descriptor) == "0")
    ):
        return _Stdin("file")
    return stdin


def _heredoc_text(node: Node) -> str:
    """The lines between a heredoc's operator line and its end marker, from the source:
    tree-sitter reads a body that starts with a backslash as words of the command and
    leaves its `heredoc_body` empty."""
    raw = node.text or b""
    end = next((c for c in node.children if c.type == "heredoc_end"), None)
    stop = len(raw) if end is None else end.start_byte - node.start_byte
    start = raw.find(b"\n", 0, stop) + 1
    return raw[start:stop].decode("utf-8", "replace") if start else ""


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
                ctx.verdicts += [write_target(w.text) for w in expand(child, ctx.env)]
        else:  # statements after the heredoc operator: `&& cmd`, `| sh`
            _walk(child, ctx, _NO_STDIN)


def _assign(node: Node, ctx: _Ctx, *, persist: bool = True) -> None:
    name_node, value = node.child_by_field_name("name"), node.child_by_field_name("value")
    name = text(name_node) if name_node is not None else ""
    for part in (name_node, value):  # `x[$(cmd)]=…` runs cmd too
        if part is not None:
            _walk(part, ctx, _NO_STDIN)
    words = expand(value, ctx.env) if value is not None else [Word("")]
    ctx.verdicts.append(code_variable(name, [w.text for w in words]))
    if any(ARITHMETIC_INJECTION.search(w.text) for w in words):
        ctx.unreadable(f"`{name}` holds `[$(…)]`, which arithmetic on it would run")
    if not persist:
        return
    appended = any(c.type == "+=" for c in node.children)
    if appended or len(words) != 1 or not words[0].known or len(words[0].text) > MAX_VALUE:
        ctx.env.pop(name, None)
    else:
        ctx.env[name] = words[0].text


def _declaration(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assign(child, ctx)
        elif child.type == "variable_name" or node.type == "unset_command":
            ctx.env.pop(text(child), None)
            _walk(child, ctx, stdin)
        else:
            _walk(child, ctx, stdin)


def _for(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    variable = node.child_by_field_name("variable")
    if variable is not None:
        ctx.env.pop(text(variable), None)
    for child in node.named_children:
        _walk(child, ctx, stdin)


def _function(node: Node, ctx: _Ctx, stdin: _Stdin) -> None:
    name_node, body = node.child_by_field_name("name"), node.child_by_field_name("body")
    name = text(name_node) if name_node is not None else ""
    calls, stack = 0, [] if body is None else [body]
    while stack:
        current = stack.pop()
        called = current.child_by_field_name("name") if current.type == "command" else None
        calls += called is not None and text(called) == name
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
    name = basename(head.text)
    words = [a.text for a in args]
    ctx.verdicts.append(fixed_rules(name, words, stdin_fed=stdin.source != "none"))
    code = stdin.source == "code"
    ctx.verdicts.append(code_rules(name, words, stdin_code=code, stdin_text=stdin.text))
    ctx.verdicts.append(deleting(name, args))
    if name in ASSIGNING_BUILTINS:
        for word in words:
            ctx.env.pop(word, None)
            ctx.verdicts.append(code_variable(word, ["?"]))  # `read GIT_PAGER`
    interpreter = interpreter_for(name)
    if name in WRAPPERS or name in {"parallel", "capsh"}:
        _wrapped(name, args, ctx, stdin, depth)
    elif name in SHELL_OPTIONS:
        script = option_value(args, SHELL_OPTIONS[name])
        if script is not None:
            _shell_text(name, script, ctx, depth)
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


def _wrapped(name: str, args: list[Word], ctx: _Ctx, stdin: _Stdin, depth: int) -> None:
    """A wrapper (`nice`, `flock`, `xargs` …): judge the command it runs."""
    inner = unwrap(name, args)
    if inner.problem:
        ctx.unreadable(inner.problem)
    if inner.split:
        ctx.unreadable("`env -S` splits a string into a command by rules of its own")
    ctx.verdicts.append(code_variables(inner.assignments))
    if inner.shell is not None:
        _shell_text(name, inner.shell, ctx, depth)
    elif name == "exec" and not inner.argv and stdin.source == "code":
        ctx.unreadable("`exec <<<`/`exec <<EOF` feeds that text to every later command")
    _judge(inner.argv, ctx, stdin, depth + 1)


def _shell_text(name: str, script: Word, ctx: _Ctx, depth: int) -> None:
    """Text that `name` hands to a shell (`flock f -c '…'`, `watch '…'`, `script -c '…'`)."""
    if script.dynamic:
        ctx.unreadable(f"the command `{name}` runs is computed at run time ({script.dynamic})")
    ctx.verdicts.append(_check_text(script.text, depth + 1))


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
    elif name == "sed" and any(SED_EXEC.search(w) for w in sed_scripts(words)):
        ctx.unreadable("the GNU sed `e` command runs shell commands")


def _shell(name: str, args: list[Word], ctx: _Ctx, stdin: _Stdin, depth: int) -> None:
    script, from_stdin, operands = shell_args(args)
    if script is not None:
        if script.dynamic:
            ctx.unreadable(f"the script of `{name} -c` is computed at run time ({script.dynamic})")
        ctx.verdicts.append(_check_text(script.text, depth + 1))
        if any(o.substituted for o in operands) and DELETES.search(script.text):
            reason = f"`{name} -c` deletes files whose names another command passes it"
            ctx.add("destructive", reason)  # `find … -exec sh -c 'rm "$1"' _ {} \;`
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


def _interpreter(name: str, spec: Interpreter, argv: list[Word], ctx: _Ctx, stdin: _Stdin) -> None:
    code, operands, has_program = interpreter_args(spec, argv[1:])
    if code is None and operands and operands[0].text in spec.subcommands:
        code = operands[1] if len(operands) > 1 else Word("")
    if code is not None:
        if code.dynamic or not read_only_inline(argv):
            ctx.unreadable(f"`{name}` runs inline code ({short(code.text)})")
            ctx.verdicts.append(fork_loop(code.text))
    elif not has_program and (not operands or operands[0].text in STDIN_PATHS):
        _stdin_program(name, ctx, stdin, fork_loop)
    elif not has_program and operands[0].substituted:
        ctx.unreadable(
            f"`{name}` runs a program produced by another command ({operands[0].dynamic})"
        )


def _awk(name: str, args: list[Word], ctx: _Ctx, stdin: _Stdin) -> None:
    found = awk_args(args)
    for program_file in found.files:
        if program_file.text in STDIN_PATHS:
            _stdin_program(name, ctx, stdin, lambda text: awk_verdict(name, awk_text(text)))
        elif program_file.substituted:  # `awk -f <(curl …)`
            ctx.unreadable(f"`{name}` runs a program produced by another command")
    ctx.verdicts.append(awk_verdict(name, found))


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
                named = Word(arg.text, found, known=False, substituted=True)
                inner.append(named if "{}" in arg.text else arg)
            _judge(inner, ctx, _NO_STDIN, depth + 1)
