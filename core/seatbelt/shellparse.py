"""Shell syntax for the `bash` blocklist: a tree-sitter-bash parse of a command line.

`parse` turns a command line into a tree once (the `Parser` is built at import) and says
whether the parse is trustworthy: tree-sitter is error-tolerant, so a tree with ERROR or
MISSING nodes, or with source bytes that no node covers (the grammar silently drops a few,
such as the `-` in `python3 - <<EOF`), is reported as a problem and the caller fails closed.

What the words of the tree expand to is worked out in `shellexpand.py`, how common programs
take their arguments in `programargs.py`; which commands are dangerous is decided in
`blocklist.py` and `commandrules.py`.
"""

from __future__ import annotations

import re
import threading

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from core.records import record

_PARSER = Parser(Language(tree_sitter_bash.language()))
_PARSER_LOCK = threading.Lock()  # a tree-sitter Parser is not safe to share between threads
_GAP = re.compile(rb"(?:\s|\\\r?\n)*")
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


def text(node: Node) -> str:
    """The source text a node covers."""
    return (node.text or b"").decode("utf-8", "replace")


def short(source: str, limit: int = 40) -> str:
    """`source` on one line, cut to `limit` characters: for quoting it in a reason."""
    source = " ".join(source.split())
    return source if len(source) <= limit else source[: limit - 1] + "…"


@record(frozen=True, slots=True)
class Parsed:
    root: Node
    problem: str  # "" when the tree is trustworthy, else what went wrong
    functions: frozenset[str]  # names given to shell functions anywhere in the text


# Characters outside the Basic Multilingual Plane, and lone surrogates: tree-sitter-bash's
# scanner can crash the whole process on some of them (`{` then U+E0000 did, found by
# fuzzing). Bash gives them no meaning of their own (every shell metacharacter is ASCII), so
# the parser reads each as as many ASCII letters as it has bytes: offsets stay the same.
_CRASHY = re.compile(rb"[\xf0-\xf7][\x80-\xbf]{3}|\xed[\xa0-\xbf][\x80-\xbf]")


def parse(source: str) -> Parsed:
    data = source.encode("utf-8", "surrogatepass")
    readable = _CRASHY.sub(lambda m: b"x" * len(m.group()), data)
    with _PARSER_LOCK:
        root = _PARSER.parse(readable).root_node
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
