"""`record`: Parley's value classes, `dataclasses.dataclass` defined for less.

A dataclass's generated methods are each compiled from source text when its class is
defined: on Python 3.11 about 0.15 ms apiece, six of them for a frozen class (`__init__`,
`__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`). A one-shot
`parley chat -m` defines about a hundred such classes before its turn, and uses fewer than
half of them, which made class definitions a sixth of its start-up (docs/benchmarks.md).

`record` takes the same options and gives the same class, for less:
- `__eq__`, `__hash__` and `__repr__` are closures over the class's field names, made
  from code compiled once, here. They compare, hash and print what the generated ones
  would: the fields with `compare` (with `hash`, where a field sets it), the fields with
  `repr`, `other.__class__ is self.__class__` for equality, `...` for a recursive repr.
- frozen's guards (`__setattr__`, `__delattr__`, and the state a slotted frozen instance
  is copied and pickled through) are closures too, with the dataclass's errors.
- `__init__` is compiled when the class is first instantiated, from the same source the
  dataclass would compile (defaults, factories, keyword-only fields, `init=False` fields,
  `__post_init__`), and replaces itself on the class: a class never instantiated never
  pays for it. Field order is checked at definition, as the dataclass checks it.
`__slots__`, `__match_args__` and `dataclasses.fields`/`replace` are the dataclass's own.
A method the class body defines is kept, as `dataclass` keeps it. `__dataclass_params__`
says what `dataclass` itself was asked for (no `__init__`, eq, repr or freezing); whether
a record is frozen is `__record_frozen__`, for the classes that extend it.
"""

from __future__ import annotations

import builtins
import dataclasses
import reprlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")
_MISSING = object()
_FACTORY = type("_HasDefaultFactory", (), {"__repr__": lambda self: "<factory>"})()


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
        if frozen:
            for name in ("__setattr__", "__delattr__"):
                if name in own:  # the dataclass's own refusal
                    raise TypeError(f"Cannot overwrite attribute {name} in class {klass.__name__}")
        _check_bases(klass, frozen)
        documented = bool(klass.__doc__)
        if not documented:  # (the dataclass would make one from `inspect.signature`)
            klass.__doc__ = klass.__name__
        built = dataclasses.dataclass(
            klass,
            init=False,
            repr=False,
            eq=False,
            match_args=match_args,
            kw_only=kw_only,
            slots=slots,
        )
        fields = dataclasses.fields(built)  # type: ignore[arg-type]
        if not documented:
            built.__doc__ = f"{built.__name__}({', '.join(f.name for f in fields if f.init)})"
        if init and "__init__" not in own:
            _put(built, _lazy_init(built, fields, frozen=frozen, slots=slots))
        if frozen:
            _freeze(built, fields, slots=slots, own=own)
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
        built.__record_frozen__ = frozen  # type: ignore[attr-defined]
        return built

    return wrap if cls is None else wrap(cls)


def _check_bases(klass: type, frozen: bool) -> None:
    """The dataclass's rules the class is made without: no InitVar fields (a record has
    none), and a record is frozen exactly when the dataclasses it extends are."""
    for name, hint in vars(klass).get("__annotations__", {}).items():
        if "InitVar" in str(hint):
            raise TypeError(f"{klass.__name__}.{name}: a record takes no InitVar fields")
    bases = [b for b in klass.__mro__[-1:0:-1] if "__dataclass_fields__" in vars(b)]
    if not bases:
        return
    any_frozen = any(_frozen_of(base) for base in bases)
    if any_frozen and not frozen:
        raise TypeError("cannot inherit non-frozen dataclass from a frozen one")
    if frozen and not any_frozen:
        raise TypeError("cannot inherit frozen dataclass from a non-frozen one")


def _frozen_of(klass: type) -> bool:
    frozen = vars(klass).get("__record_frozen__")
    return bool(klass.__dataclass_params__.frozen if frozen is None else frozen)  # type: ignore[attr-defined]


def _lazy_init(
    klass: type, fields: tuple[dataclasses.Field[Any], ...], *, frozen: bool, slots: bool
) -> Callable[..., None]:
    """An `__init__` that compiles the real one at the first call and puts it on the class
    in its place. The field order is checked now, as the dataclass does."""
    seen_default = False
    for f in fields:
        if not f.init or f.kw_only:
            continue
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")

    def __init__(*args: Any, **kwargs: Any) -> None:  # (a field may be named `self`)
        made = _compiled_init(klass, fields, frozen=frozen, slots=slots)
        klass.__init__ = made  # type: ignore[misc]
        made(*args, **kwargs)

    return __init__


def _compiled_init(
    klass: type, fields: tuple[dataclasses.Field[Any], ...], *, frozen: bool, slots: bool
) -> Callable[..., None]:
    """The `__init__` `dataclasses.dataclass` would have compiled for `klass`: the same
    parameters, defaults, factories, assignments and `__post_init__` call."""
    self_name = "__dataclass_self__" if any(f.name == "self" for f in fields) else "self"
    bound: dict[str, Any] = {"_set": object.__setattr__, "_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in fields:
        default = f"_dflt_{f.name}"
        if f.default_factory is not dataclasses.MISSING:
            bound[default] = f.default_factory
            value = f"{default}()"
            if f.init:
                value = f"{default}() if {f.name} is _FACTORY else {f.name}"
            param = f"{f.name}=_FACTORY"
        elif f.init:
            value = param = f.name
            if f.default is not dataclasses.MISSING:
                bound[default] = f.default
                param = f"{f.name}={default}"
        elif slots and f.default is not dataclasses.MISSING:
            bound[default] = f.default
            value = default
        else:  # not set here: the class attribute holds its default
            continue
        if f.init:
            (keyword if f.kw_only else positional).append(param)
        if frozen:
            body.append(f"_set({self_name}, {f.name!r}, {value})")
        else:
            body.append(f"{self_name}.{f.name} = {value}")
    if hasattr(klass, "__post_init__"):
        body.append(f"{self_name}.__post_init__()")
    params = [self_name, *positional, *(["*", *keyword] if keyword else [])]
    lines = "\n".join(f"  {line}" for line in body or ["pass"])
    source = (
        f"def __create__({', '.join(bound)}):\n"
        f" def __init__({', '.join(params)}):\n{lines}\n"
        " return __init__\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, {"__builtins__": builtins}, namespace)  # our own text, as dataclass's
    made: Callable[..., None] = namespace["__create__"](**bound)
    made.__qualname__ = f"{klass.__qualname__}.__init__"
    return made


def _freeze(
    klass: type[Any], fields: tuple[dataclasses.Field[Any], ...], *, slots: bool, own: set[str]
) -> None:
    """Frozen's guards, as the dataclass makes them; and, slotted, the state an instance is
    copied and pickled through (set past the guards)."""
    names = frozenset(f.name for f in fields)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is klass or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(klass, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is klass or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(klass, self).__delattr__(name)

    _put(klass, __setattr__)
    _put(klass, __delattr__)
    if slots:
        if "__getstate__" not in own:
            klass.__getstate__ = _getstate  # type: ignore[assignment]
        if "__setstate__" not in own:
            klass.__setstate__ = _setstate


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=False):
        object.__setattr__(self, f.name, value)


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
