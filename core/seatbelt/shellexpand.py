"""Word expansion for the `bash` blocklist: what each word of a parsed command becomes.

`expand` evaluates one word node the way bash would, as far as that is knowable before the
command runs: quotes are removed (`r''m` is `rm`), ANSI-C strings are decoded, brace
expansion is done, variables assigned statically earlier on the same line are substituted
(and word-split when unquoted), and `$(echo …)`/`$(printf …)` with static arguments are
evaluated. Everything else keeps its source spelling (`$HOME`) with `known=False`. Any part
computed at run time is recorded in `Word.dynamic`, so the caller can refuse to trust a
program name it cannot read.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import field

from tree_sitter import Node

from core.records import record
from core.seatbelt.shellparse import short, text

MAX_WORDS = 256  # a brace or split expansion giving more words than this stays unexpanded
MAX_VALUE = 4096  # statically known variable values longer than this are forgotten

_QUOTED, _UNQUOTED, _EXPANDED = 0, 1, 2  # atom kinds: how bash treats one character
_Atom = tuple[str, int]
_ANSI_C = re.compile(
    r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.S
)
_ANSI_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
_STATIC_PARTS = frozenset(
    {"command_name", "word", "string", "raw_string", "concatenation", "number",
     "simple_expansion", "expansion", "ansi_c_string", "command_substitution"}
)  # fmt: skip
_SEQUENCE = re.compile(r"(-?\d{1,6}|[A-Za-z])\.\.(-?\d{1,6}|[A-Za-z])(?:\.\.(-?\d{1,6}))?")


@record(frozen=True, slots=True)
class Word:
    """One word after expansion, as far as it can be known before the command runs."""

    text: str
    dynamic: str = ""  # what makes it computed at run time: `$R`, `$(echo rm)`, `{a,b}`, a glob
    known: bool = True  # False: `text` is only the source spelling, e.g. `$HOME`
    substituted: bool = False  # a command or process substitution produced (part of) it


@record(slots=True)
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
