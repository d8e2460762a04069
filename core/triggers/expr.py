"""The small, safe expression language of a trigger's `filter` and `close_on`.

An expression asks a question of a webhook's JSON payload, e.g.
`action in ['completed'] and check_run.conclusion == 'failure'`. It is parsed once, at
load time, with Python's `ast` (mode "eval"), and every node is checked against a strict
whitelist; nothing is ever handed to `eval`. What is allowed:

- `and`, `or`, `not`; comparisons `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`
  (chained like Python's, `1 <= x < 5`);
- field paths into the payload: names, `.key` and `[0]` / `['key']` subscripts; a path
  that does not exist is `None`, never an error;
- literals: strings, numbers (a leading `-` too), `True`/`False`/`None` (and JSON's
  `true`/`false`/`null`), lists and tuples of those.

Anything else (calls, lambdas, comprehensions, arithmetic, f-strings, walrus, slices,
names beginning with `__`) is a `ConfigError` naming the character it was found at; a
payload key beginning with `__` is reached as `x['__typename']` (only ever a JSON lookup).
At run time nothing raises: an ordering between values of different types (`'a' < 1`)
is False, and so is `in` against something that is not a container.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from core.errors import ConfigError, FixableError

MAX_LENGTH: Final = 1000  # characters of one expression
MAX_NODES: Final = 200  # syntax nodes of one expression; keeps evaluation and recursion small

MISSING: Final = object()  # what `lookup` returns for a path that is not in the payload
# JSON's spellings, so `draft == false` does not quietly look up a payload key "false"
_ALIASES: Final[Mapping[str, object]] = {"true": True, "false": False, "null": None}
_ALLOWED_HELP: Final = (
    "use only field paths (a.b, a[0], a['key']), literals (strings, numbers, True/False/None, "
    "lists), comparisons (== != < <= > >= in, not in) and and/or/not"
)

Step = str | int
Evaluate = Callable[[Mapping[str, Any]], object]


class ExprRefused(FixableError):
    """An expression or path outside the language; `position` is its 1-based character."""

    def __init__(self, text: str, what: str, position: int) -> None:
        self.text, self.what, self.position = text, what, position
        super().__init__(f"{what} at character {position} of `{text}`", _ALLOWED_HELP)


@dataclass(frozen=True, slots=True)
class Expr:
    """A compiled `filter` or `close_on` expression."""

    text: str
    _evaluate: Evaluate

    def value(self, payload: Mapping[str, Any]) -> object:
        """The expression's value over `payload` (a parsed JSON object). Never raises."""
        return self._evaluate(payload)

    def matches(self, payload: Mapping[str, Any]) -> bool:
        """Whether the expression holds for `payload`: its value's truth. Never raises."""
        return bool(self._evaluate(payload))


def compile_expr(text: str, *, key: str = "filter") -> Expr:
    """Parse and check `text` once, at load time.

    Raises:
        ConfigError: `text` is empty, too long or outside the language; `key` names the
            setting (e.g. "triggers.ci.filter") and the problem names the character.
    """
    try:
        return Expr(text, _node(*_parse(text)))
    except ExprRefused as exc:
        raise ConfigError(key, str(exc), exc.fix) from exc


def parse_path(text: str) -> tuple[Step, ...]:
    """The steps of a field path such as `issues[0].id` (a template's placeholder).

    Raises:
        ExprRefused: `text` is not a plain path.
    """
    src, node = _parse(text)
    if (steps := _path_steps(src, node)) is None:
        raise ExprRefused(src, "only a field path is allowed", src.char_at(node))
    return steps


def lookup(payload: object, steps: Sequence[Step]) -> object:
    """Follow `steps` into `payload`; `MISSING` where a step finds nothing."""
    value = payload
    for step in steps:
        if (value := _step(value, step)) is MISSING:
            break
    return value


class _Source(str):
    """The expression as shown in errors, to turn an AST's byte columns into characters."""

    __slots__ = ()

    def char_at(self, node: ast.AST) -> int:
        """The 1-based character `node` starts at; an attribute's name, for `a.b`."""
        if isinstance(node, ast.Attribute) and node.end_col_offset is not None:
            return self._chars(node.end_col_offset) - len(node.attr) + 1
        return self._chars(getattr(node, "col_offset", 0)) + 1

    def _chars(self, column: int) -> int:
        return len(self.encode()[:column].decode(errors="ignore"))


def _parse(text: str) -> tuple[_Source, ast.expr]:
    # a TOML multi-line string may break an expression over lines: they count as spaces
    flat = text.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    body = flat.strip()
    if not body:
        raise ExprRefused(body, "an empty expression", 1)
    if len(flat) > MAX_LENGTH:
        raise ExprRefused(body[:40] + "…", f"longer than {MAX_LENGTH} characters", MAX_LENGTH)
    source = _Source(body)
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        raise ExprRefused(body, f"not valid syntax ({exc.msg})", exc.offset or 1) from exc
    except (ValueError, MemoryError, RecursionError) as exc:  # NUL bytes, absurd nesting
        raise ExprRefused(body, "not valid syntax", 1) from exc
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ExprRefused(body, f"more than {MAX_NODES} parts", 1)
    return source, tree.body


_COMPARE: Final[Mapping[type[ast.cmpop], Callable[[Any, Any], bool]]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: _contains(b, a),
    ast.NotIn: lambda a, b: not _contains(b, a),
}


def _node(src: _Source, node: ast.expr) -> Evaluate:
    match node:
        case ast.BoolOp(op=op, values=values):
            parts = [_node(src, v) for v in values]
            return lambda p: _decide(parts, p, stop_on=isinstance(op, ast.Or))
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            inner = _node(src, operand)
            return lambda p: not inner(p)
        case ast.Compare(left=left, ops=ops, comparators=rights):
            return _comparison(src, node, left, ops, rights)
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            items = [_node(src, e) for e in elts]
            return lambda p: [item(p) for item in items]
        case ast.Name() | ast.Attribute() | ast.Subscript():
            return _path(src, node)
    constant = _literal(src, node)
    return lambda p: constant


def _comparison(
    src: _Source, node: ast.expr, left: ast.expr, ops: list[ast.cmpop], rights: list[ast.expr]
) -> Evaluate:
    for op in ops:
        if type(op) not in _COMPARE:  # `is` / `is not`
            name = "is not" if isinstance(op, ast.IsNot) else "is"
            raise ExprRefused(src, f"`{name}` is not allowed", src.char_at(node))
    tests = [_COMPARE[type(op)] for op in ops]
    operands = [_node(src, left), *(_node(src, r) for r in rights)]

    def compare(payload: Mapping[str, Any]) -> bool:
        values = [operand(payload) for operand in operands]
        return all(_safely(test, values[i], values[i + 1]) for i, test in enumerate(tests))

    return compare


def _path(src: _Source, node: ast.expr) -> Evaluate:
    steps = _path_steps(src, node)
    if steps is None:  # a key or index asked of something that is not a path
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        raise ExprRefused(src, _refusal(node), src.char_at(node))
    if len(steps) == 1 and isinstance(node, ast.Name) and node.id in _ALIASES:
        alias = _ALIASES[node.id]
        return lambda p: alias
    return lambda p: None if (found := lookup(p, steps)) is MISSING else found


def _path_steps(src: _Source, node: ast.expr) -> tuple[Step, ...] | None:
    """A path's steps, root first; None if `node` is not a plain path. Refuses dunders."""
    steps: list[Step] = []
    while True:
        match node:
            case ast.Name(id=name):
                _check_name(src, node, name)
                return (name, *reversed(steps))
            case ast.Attribute(value=value, attr=attr):
                _check_name(src, node, attr)
                steps.append(attr)
                node = value
            case ast.Subscript(value=value, slice=key):
                steps.append(_subscript_key(src, key))
                node = value
            case _:
                return None


def _subscript_key(src: _Source, key: ast.expr) -> Step:
    if isinstance(key, ast.Constant | ast.UnaryOp):
        literal = _literal(src, key)
        if isinstance(literal, str) or (isinstance(literal, int) and not isinstance(literal, bool)):
            return literal
    raise ExprRefused(src, "a subscript must be a number or a quoted key", src.char_at(key))


def _check_name(src: _Source, node: ast.expr, name: str) -> None:
    if name.startswith("__"):
        raise ExprRefused(src, f"the name `{name}` is not allowed", src.char_at(node))


def _literal(src: _Source, node: ast.expr) -> object:
    match node:
        case ast.Constant(value=value) if value is None or isinstance(value, str | int | float):
            return value
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=value)) if isinstance(
            value, int | float
        ) and not isinstance(value, bool):
            return -value
    raise ExprRefused(src, _refusal(node), src.char_at(node))


_KINDS: Final[Mapping[type[ast.AST], str]] = {
    ast.Call: "a function call",
    ast.Lambda: "a lambda",
    **dict.fromkeys([ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp], "a comprehension"),
    ast.BinOp: "arithmetic",
    ast.JoinedStr: "an f-string",
    ast.NamedExpr: "an assignment (:=)",
    ast.IfExp: "a conditional expression",
    ast.Dict: "a dict literal",
    ast.Set: "a set literal",
}


def _refusal(node: ast.expr) -> str:
    kind = _KINDS.get(type(node))
    if isinstance(node, ast.Constant):
        kind = f"the literal {node.value!r}"[:60]
    elif isinstance(node, ast.UnaryOp):
        kind = "this operator"
    return f"{kind or type(node).__name__} is not allowed"


def _step(value: object, step: Step) -> object:
    if isinstance(step, str):
        return value.get(step, MISSING) if isinstance(value, Mapping) else MISSING
    if isinstance(value, list | tuple) and -len(value) <= step < len(value):
        return value[step]
    return MISSING


def _decide(parts: list[Evaluate], payload: Mapping[str, Any], *, stop_on: bool) -> object:
    """`and` (stops at the first false value) or `or` (the first true one), like Python."""
    value: object = not stop_on
    for part in parts:
        value = part(payload)
        if bool(value) is stop_on:
            break
    return value


def _contains(container: object, item: object) -> bool:
    if not isinstance(container, list | tuple | Mapping) and not (
        isinstance(container, str) and isinstance(item, str)
    ):
        return False
    try:
        return item in container
    except TypeError:  # an unhashable key looked up in an object
        return False


def _safely(test: Callable[[Any, Any], bool], left: object, right: object) -> bool:
    try:
        return bool(test(left, right))
    except TypeError:  # an ordering between types that have none: the question is False
        return False
