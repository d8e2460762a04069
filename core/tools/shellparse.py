"""Shell syntax for the `bash` blocklist: a tree-sitter-bash parse, and what words expand to.

`parse` turns a command line into a tree once (the `Parser` is built at import) and says
whether the parse is trustworthy: tree-sitter is error-tolerant, so a tree with ERROR or
MISSING nodes, or with source bytes that no node covers (the grammar silently drops a few,
such as the `-` in `python3 - <<EOF`), is reported as a problem and the caller fails closed.

`expand` evaluates one word node the way bash would, as far as that is knowable before the
command runs: quotes are removed (`r''m` is `rm`), ANSI-C strings are decoded, brace
expansion is done, variables assigned statically earlier on the same line are substituted
(and word-split when unquoted), and `$(echo …)`/`$(printf …)` with static arguments are
evaluated. Everything else keeps its source spelling (`$HOME`) with `known=False`. Any part
computed at run time is recorded in `Word.dynamic`, so the caller can refuse to trust a
program name it cannot read.

The last part knows how common programs take their arguments: wrappers (`env`, `xargs` …),
`sh -c`, interpreters' inline-code flags (`python3 -c`, `perl -e` …), awk and sed scripts.
Which of those are dangerous is decided in `blocklist.py`, not here.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

MAX_WORDS = 256  # a brace or split expansion giving more words than this stays unexpanded
MAX_VALUE = 4096  # statically known variable values longer than this are forgotten

_PARSER = Parser(Language(tree_sitter_bash.language()))
_PARSER_LOCK = threading.Lock()  # a tree-sitter Parser is not safe to share between threads

_QUOTED, _UNQUOTED, _EXPANDED = 0, 1, 2  # atom kinds: how bash treats one character
_Atom = tuple[str, int]
_GAP = re.compile(rb"(?:\s|\\\r?\n)*")
_ANSI_C = re.compile(
    r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.S
)
_ANSI_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
# `{a,b}` in command position: tree-sitter reads `{` as a group; bash brace-expands it.
# `""{a,b}` means the same to bash and parses as one word.
BRACE_COMMAND = re.compile(
    r"(?:^|(?<=[;&|(\n`!])|(?<=\bthen)|(?<=\bdo)|(?<=\belse))([ \t]*)\{(?=[^\s{}]*,)"
)
# tree-sitter drops a lone `-` before a heredoc (`kubectl apply -f - <<EOF`); `"-"` is the
# same word to bash and parses.
DASH_BEFORE_HEREDOC = re.compile(r"(?<=[ \t])-(?=[ \t]*<<(?!<))")
# A backslash-newline that is not itself escaped.
LINE_CONTINUATION = re.compile(r"(?<!\\)((?:\\\\)*)\\\r?\n")
_STATIC_PARTS = frozenset(
    {"command_name", "word", "string", "raw_string", "concatenation", "number",
     "simple_expansion", "expansion", "ansi_c_string", "command_substitution"}
)  # fmt: skip
_SEQUENCE = re.compile(r"(-?\d{1,6}|[A-Za-z])\.\.(-?\d{1,6}|[A-Za-z])(?:\.\.(-?\d{1,6}))?")


def text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def short(source: str, limit: int = 40) -> str:
    source = " ".join(source.split())
    return source if len(source) <= limit else source[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Parsed:
    root: Node
    problem: str  # "" when the tree is trustworthy, else what went wrong
    functions: frozenset[str]  # names given to shell functions anywhere in the text


def parse(source: str) -> Parsed:
    data = source.encode("utf-8", "surrogatepass")
    with _PARSER_LOCK:
        root = _PARSER.parse(data).root_node
    spans: list[tuple[int, int]] = []
    functions: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition" and (name := node.child_by_field_name("name")):
            functions.add(text(name))
        if node.child_count == 0 or node.type == "heredoc_body":
            spans.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    problem = "a syntax error" if root.has_error else _uncovered(data, spans)
    return Parsed(root, problem, frozenset(functions))


def parse_readings(source: str) -> tuple[list[Parsed], str]:
    """Every plausible reading of `source`, and the parse problem ("" if none).

    Where tree-sitter and bash may disagree, both readings are returned and the caller judges
    each: bash joins `r\\<newline>m` into `rm` (tree-sitter splits the word). A reading
    tree-sitter cannot parse is retried with spellings that mean the same to bash: `{rm,-rf,x}`
    in command position (tree-sitter sees a broken `{ …; }`) and `- <<EOF` (it drops the `-`).
    """
    trees: list[Parsed] = []
    problem = ""
    joined = LINE_CONTINUATION.sub(r"\1", source)
    for reading in dict.fromkeys([source, joined]):
        trees.append(parse(reading))
        if not trees[-1].problem:
            continue
        retry = DASH_BEFORE_HEREDOC.sub('"-"', BRACE_COMMAND.sub(r'\1""{', reading))
        if retry != reading:
            trees.append(parse(retry))
        if retry == reading or trees[-1].problem:  # else it was valid bash after all
            problem = problem or trees[-2 if retry != reading else -1].problem
    return trees, problem


def _uncovered(data: bytes, spans: list[tuple[int, int]]) -> str:
    """Describe source text that no leaf covers (besides blanks), or ""."""
    position = 0
    for start, end in [*sorted(spans), (len(data), len(data))]:
        if start > position and not _GAP.fullmatch(data, position, start):
            lost = data[position:start].decode("utf-8", "replace").strip()
            return f"the parser skipped `{short(lost)}`"
        position = max(position, end)
    return ""


@dataclass(frozen=True, slots=True)
class Word:
    """One word after expansion, as far as it can be known before the command runs."""

    text: str
    dynamic: str = ""  # what makes it computed at run time: `$R`, `$(echo rm)`, `{a,b}`, a glob
    known: bool = True  # False: `text` is only the source spelling, e.g. `$HOME`
    substituted: bool = False  # a command or process substitution produced (part of) it


@dataclass(slots=True)
class _Acc:
    atoms: list[_Atom] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    known: bool = True
    substituted: bool = False

    def add(self, chars: str, kind: int) -> None:
        self.atoms.extend((c, kind) for c in chars)

    def opaque(self, node: Node, *, substituted: bool = False) -> None:
        """A part whose value is unknown: keep its spelling, quoted, and note why."""
        self.add(text(node), _QUOTED)
        self.reasons.append(short(text(node)))
        self.known = False
        self.substituted |= substituted


def expand(node: Node, env: Mapping[str, str]) -> list[Word]:
    """The words one argument node becomes (several after brace expansion or splitting)."""
    acc = _Acc()
    _atoms(node, env, acc, quoted=False)
    fields = _brace(acc.atoms)
    if fields is None:
        fields = [acc.atoms]
        acc.reasons.append(f"the brace expansion {short(text(node))}")
    elif len(fields) > 1:
        acc.reasons.append(f"the brace expansion {short(text(node))}")
    words: list[Word] = []
    for atoms in fields:
        for piece in _split(atoms):
            reasons = list(acc.reasons)
            if _is_glob(piece):
                reasons.append(f"the glob {short(''.join(c for c, _ in piece))}")
            dynamic = "; ".join(dict.fromkeys(reasons))
            words.append(Word("".join(c for c, _ in piece), dynamic, acc.known, acc.substituted))
    return words


def _atoms(node: Node, env: Mapping[str, str], acc: _Acc, *, quoted: bool) -> None:
    kind = node.type
    if kind in {"concatenation", "command_name"}:
        for child in node.children:
            _atoms(child, env, acc, quoted=quoted)
    elif node.child_count == 0 and kind not in {"ansi_c_string", "raw_string"}:
        if quoted:
            acc.add(_unescape_double(text(node)), _QUOTED)
        else:
            _unquoted(text(node), acc)
    elif kind == "brace_expression":
        _unquoted(text(node), acc)
    elif kind == "raw_string":
        acc.add(text(node)[1:-1], _QUOTED)
    elif kind == "ansi_c_string":
        acc.add(decode_ansi_c(text(node)[2:-1]), _QUOTED)
        acc.reasons.append(f"the ANSI-C string {short(text(node))}")
    elif kind == "string":
        _double_quoted(node, env, acc)
    elif kind == "translated_string":
        for child in node.named_children:
            _atoms(child, env, acc, quoted=True)
    elif kind in {"simple_expansion", "expansion"}:
        _variable(node, env, acc, quoted=quoted)
    elif kind == "command_substitution":
        output = static_output(node, env)
        if output is None:
            acc.opaque(node, substituted=True)
            return
        acc.add(output.rstrip("\n"), _QUOTED if quoted else _EXPANDED)
        acc.reasons.append(short(text(node)))
        acc.substituted = True
    else:  # process and arithmetic substitutions, arrays, anything unforeseen
        acc.opaque(node, substituted=kind == "process_substitution")


def _double_quoted(node: Node, env: Mapping[str, str], acc: _Acc) -> None:
    """`"…"`: literal text is taken from the source bytes, as tree-sitter leaves gaps."""
    raw, base = node.text or b"", node.start_byte
    position, end = 1, max(1, len(raw) - 1)
    for child in node.named_children:
        if child.type == "string_content":
            continue
        literal = raw[position : child.start_byte - base].decode("utf-8", "replace")
        acc.add(_unescape_double(literal), _QUOTED)
        _atoms(child, env, acc, quoted=True)
        position = child.end_byte - base
    acc.add(_unescape_double(raw[position:end].decode("utf-8", "replace")), _QUOTED)


def _variable(node: Node, env: Mapping[str, str], acc: _Acc, *, quoted: bool) -> None:
    names = [c for c in node.named_children if c.type == "variable_name"]
    simple = len(names) == 1 and node.named_child_count == 1
    simple = simple and (node.type == "simple_expansion" or node.child_count == 3)
    name = text(names[0]) if simple else ""
    if name not in env:
        acc.opaque(node)
        return
    acc.add(env[name], _QUOTED if quoted else _EXPANDED)
    acc.reasons.append(short(text(node)))


def _unquoted(source: str, acc: _Acc) -> None:
    i = 0
    while i < len(source):
        char = source[i]
        if char == "\\" and i + 1 < len(source):
            if source[i + 1] != "\n":
                acc.atoms.append((source[i + 1], _QUOTED))
            i += 2
            continue
        acc.atoms.append((char, _UNQUOTED))
        i += 1


def _unescape_double(source: str) -> str:
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), source)


def decode_ansi_c(body: str) -> str:
    """Decode the inside of `$'…'` (also what `echo -e` and `printf` do with escapes)."""

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] in "xuU":
            value = int(code[1:], 16)
            return chr(value) if value <= 0x10FFFF else match.group(0)
        if code[0] in "01234567":
            return chr(int(code, 8) & 0xFF)
        if code[0] == "c" and len(code) == 2:
            return chr(ord(code[1].upper()) & 0x1F)
        return _ANSI_SIMPLE.get(code, match.group(0))

    return _ANSI_C.sub(one, body)


def _brace(atoms: list[_Atom]) -> list[list[_Atom]] | None:
    """Bash brace expansion over atoms; None when it would give more than MAX_WORDS."""
    for i, (char, kind) in enumerate(atoms):
        if char != "{" or kind != _UNQUOTED:
            continue
        group = _brace_group(atoms, i)
        if group is None:
            continue
        end, options = group
        if len(options) > MAX_WORDS:
            return None
        out: list[list[_Atom]] = []
        for option in options:
            expanded = _brace(atoms[:i] + option + atoms[end + 1 :])
            if expanded is None or len(out) + len(expanded) > MAX_WORDS:
                return None
            out += expanded
        return out
    return [atoms]


def _brace_group(atoms: list[_Atom], start: int) -> tuple[int, list[list[_Atom]]] | None:
    depth, commas = 0, list[int]()
    for j in range(start + 1, len(atoms)):
        char, kind = atoms[j]
        if kind != _UNQUOTED:
            continue
        if char == "{":
            depth += 1
        elif char == "}" and depth:
            depth -= 1
        elif char == "}":
            bounds = [start, *commas, j]
            if commas:
                return j, [atoms[a + 1 : b] for a, b in itertools.pairwise(bounds)]
            body = atoms[start + 1 : j]
            if all(k == _UNQUOTED for _, k in body):
                sequence = _sequence("".join(c for c, _ in body))
                if sequence is not None:
                    return j, [[(s, _QUOTED) for s in item] for item in sequence]
            return None
        elif char == "," and depth == 0:
            commas.append(j)
    return None


def _sequence(body: str) -> list[str] | None:
    match = _SEQUENCE.fullmatch(body)
    if match is None:
        return None
    first, last, step_text = match.groups()
    step = abs(int(step_text or "1")) or 1
    if first.isalpha() != last.isalpha():
        return None
    a, b = (ord(first), ord(last)) if first.isalpha() else (int(first), int(last))
    if abs(b - a) // step > MAX_WORDS:
        return [""] * (MAX_WORDS + 1)
    values = range(a, b + (1 if b >= a else -1), step if b >= a else -step)
    return [chr(v) if first.isalpha() else str(v) for v in values]


def _split(atoms: list[_Atom]) -> list[list[_Atom]]:
    """Word splitting: unquoted expansion results break at blanks."""
    if not any(kind == _EXPANDED and c in " \t\n" for c, kind in atoms):
        return [atoms]
    pieces: list[list[_Atom]] = [[]]
    for atom in atoms:
        if atom[1] == _EXPANDED and atom[0] in " \t\n":
            pieces.append([])
        else:
            pieces[-1].append(atom)
    return [piece for piece in pieces if piece]


def _is_glob(atoms: list[_Atom]) -> bool:
    active = "".join(c if kind != _QUOTED else "\0" for c, kind in atoms)
    return "*" in active or "?" in active or bool(re.search(r"\[[^\0]*\]", active))


def static_output(node: Node, env: Mapping[str, str]) -> str | None:
    """What `$(echo …)`, `$(printf …)` or a pipeline stage `echo …` prints, if static."""
    commands = [c for c in node.named_children if c.type != "comment"]
    if node.type == "command":
        commands = [node]
    if len(commands) != 1 or commands[0].type != "command":
        return None
    words: list[Word] = []
    for child in commands[0].named_children:
        if child.type not in _STATIC_PARTS:
            return None
        words += expand(child, env)
    if not words or not all(w.known for w in words):
        return None
    return _echo([w.text for w in words])


def _echo(argv: list[str]) -> str | None:
    name, args = argv[0], argv[1:]
    if name == "echo":
        newline, escapes = True, False
        while args and re.fullmatch(r"-[neE]+", args[0]):
            newline = newline and "n" not in args[0]
            escapes = "e" in args[0] or (escapes and "E" not in args[0])
            args = args[1:]
        output = " ".join(args)
        return (decode_ansi_c(output) if escapes else output) + ("\n" if newline else "")
    if name != "printf" or not args or args[0].startswith("-"):
        return None
    form, values = decode_ansi_c(args[0]).replace("%%", "\0"), args[1:]
    if "%" in form.replace("%s", ""):
        return None
    slots = form.count("%s")
    if not slots:
        return form.replace("\0", "%")
    chunks = [values[i : i + slots] for i in range(0, max(len(values), 1), slots)]
    output = ""
    for chunk in chunks:
        parts = form.split("%s")
        filled = [*chunk, *[""] * (slots - len(chunk))]
        output += parts[0] + "".join(v + p for v, p in zip(filled, parts[1:], strict=True))
    return output.replace("\0", "%")


# --- how programs take their arguments ---------------------------------------------

STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
# Wrappers that run the rest of their argv; the value is the options taking an argument.
WRAPPERS: dict[str, frozenset[str]] = {
    "nohup": frozenset(),
    "exec": frozenset({"-a"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "coproc": frozenset(),
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
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
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


def unwrap(name: str, args: list[Word]) -> list[Word]:
    """The argv a wrapper runs (options, assignments and `timeout`'s duration removed)."""
    takes_arg, replace, i = WRAPPERS[name], None, 0
    while i < len(args):
        arg = args[i].text
        if arg == "--":
            i += 1
            break
        if name == "env" and re.match(r"-S|--split-string", arg):  # `env -S "cmd args"`
            attached = arg[2:] if arg.startswith("-S") else arg.partition("=")[2]
            split = Word(attached, args[i].dynamic, args[i].known) if attached else None
            split = split or (args[i + 1] if i + 1 < len(args) else Word(""))
            pieces = [Word(p, split.dynamic, split.known) for p in split.text.split()]
            return pieces + args[i + (1 if attached else 2) :]
        if name == "command" and arg in {"-v", "-V"}:
            return []  # only looks the name up
        if name == "xargs" and re.fullmatch(r"-[Ii].*|--replace(=.*)?", arg):
            replace = args[i + 1].text if arg == "-I" and i + 1 < len(args) else "{}"
            replace = arg[2:] if arg[:2] in {"-i", "-I"} and len(arg) > 2 else replace
            replace = arg.split("=", 1)[1] if arg.startswith("--replace=") else replace
        if name == "env" and ASSIGNMENT.match(arg):
            i += 1
        elif arg.startswith("-") and len(arg) > 1:
            i += 2 if arg in takes_arg else 1
        else:
            break
    rest = args[i:]
    if name == "timeout":
        rest = rest[1:]
    if name == "coproc":  # `coproc NAME { cmd; }`: tree-sitter leaves these as plain words
        rest = rest[1:] if len(rest) > 1 and rest[1].text == "{" else rest
        rest = rest[1:] if rest and rest[0].text == "{" else rest
    return xargs_input(rest, replace) if name == "xargs" else rest


def xargs_input(argv: list[Word], replace: str | None) -> list[Word]:
    """xargs adds words read from stdin: to the end, or in place of the -I string."""
    argv = argv or [Word("echo")]
    read = "words read by xargs"
    if replace is None:
        return [*argv, Word("", read, known=False)]
    return [Word(w.text, read, known=False) if replace in w.text else w for w in argv]


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


def awk_program(args: list[Word]) -> tuple[Word | None, bool]:
    """(inline awk program, whether a `-f` program file is stdin) from awk arguments."""
    i = 0
    while i < len(args):
        arg = args[i].text
        if arg in {"-f", "--file"}:
            return None, i + 1 < len(args) and args[i + 1].text in STDIN_PATHS
        if arg in {"-e", "--source"}:
            return (args[i + 1] if i + 1 < len(args) else None), False
        if arg in {"-v", "-F", "--assign", "--field-separator", "-i", "--include"}:
            i += 1
        elif arg == "--":
            return (args[i + 1] if i + 1 < len(args) else None), False
        elif not arg.startswith("-") or arg == "-":
            return args[i], False
        i += 1
    return None, False


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
