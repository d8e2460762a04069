"""`record`: Parley's value classes, `dataclasses.dataclass` defined for less.

A dataclass's generated methods are each compiled from source text when its class is
defined: on Python 3.11 about 0.15 ms apiece, six of them for a frozen class (`__init__`,
`__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`). A one-shot
`parley chat -m` defines about a hundred such classes before its turn, which made class
definitions a sixth of its start-up (docs/benchmarks.md).

`record` takes the same options and gives the same class, except that `__eq__`, `__hash__`
and `__repr__` are not compiled for each class: they are closures over the class's field
names, made from code compiled once, here. They compare, hash and print what the
generated ones would: the fields with `compare` (with `hash`, where a field sets it), the
fields with `repr`, `other.__class__ is self.__class__` for equality, `...` for a
recursive repr. `__init__` (with defaults, factories and `__post_init__`), frozen's
guards, `__slots__`, `__match_args__` and `dataclasses.fields`/`replace` are the
dataclass's own. A method the class body defines is kept, as `dataclass` keeps it.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")
_MISSING = object()


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    match_args: bool = True,
    kw_only: bool = False,
    slots: bool = False,
) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(
    cls: type[T] | None = None,
    /,
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    match_args: bool = True,
    kw_only: bool = False,
    slots: bool = False,
) -> type[T] | Callable[[type[T]], type[T]]:
    """`dataclasses.dataclass(cls, ...)` with shared `__eq__`, `__hash__` and `__repr__`
    (see the module's docstring); `@record` or `@record(frozen=True, slots=True)`."""

    def wrap(klass: type[T]) -> type[T]:
        own = set(vars(klass))  # what the class body defines is kept
        built = dataclasses.dataclass(
            klass,
            init=init,
            repr=False,
            eq=False,
            frozen=frozen,
            match_args=match_args,
            kw_only=kw_only,
            slots=slots,
        )
        fields = dataclasses.fields(built)  # type: ignore[arg-type]
        if repr and "__repr__" not in own:
            _put(built, _repr([f.name for f in fields if f.repr]))
        if eq and "__eq__" not in own:
            _put(built, _eq(_values([f.name for f in fields if f.compare])))
        # `dataclass`'s rule for `__hash__` (without `unsafe_hash`): a hash of its own (not
        # the None that defining `__eq__` implies) is kept; else frozen and compared
        # hashes its compared fields, and mutable and compared is unhashable.
        class_hash = vars(klass).get("__hash__", _MISSING)
        explicit = not (class_hash is _MISSING or (class_hash is None and "__eq__" in own))
        if eq and not explicit:
            if frozen:
                hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
                _put(built, _hash(_values(hashed)))
            else:
                built.__hash__ = None  # type: ignore[assignment]
        return built

    return wrap if cls is None else wrap(cls)


def _put(klass: type, method: Callable[..., Any]) -> None:
    method.__qualname__ = f"{klass.__qualname__}.{method.__name__}"
    setattr(klass, method.__name__, method)


def _values(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """`obj -> (obj.a, obj.b, ...)` for `names`, as a tuple whatever their number."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _eq(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _repr(names: list[str]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__
