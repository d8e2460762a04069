"""`core.records.record` gives the class `dataclasses.dataclass` would, shared methods aside."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from core.records import record

OPTIONS: list[dict[str, Any]] = [
    {},
    {"frozen": True},
    {"slots": True},
    {"frozen": True, "slots": True},
    {"eq": False},
    {"frozen": True, "eq": False},
    {"repr": False},
    {"kw_only": True, "frozen": True, "slots": True},
]


def twins(**options: Any) -> tuple[type, type]:
    """The same class body made by `record` and by `dataclass`, with every kind of field."""

    def body(decorate: Any) -> type:
        @decorate(**options)
        class Point:
            x: int
            tags: list[str] = dataclasses.field(default_factory=list, compare=False)
            label: str = dataclasses.field(default="p", repr=False)
            weight: float = dataclasses.field(default=1.0, hash=False)

        return Point

    return body(record), body(dataclasses.dataclass)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_a_record_compares_hashes_and_prints_as_the_dataclass_does(
    options: dict[str, Any],
) -> None:
    ours, theirs = twins(**options)

    def make(cls: type, *args: Any) -> Any:
        names = ("x", "tags", "label", "weight")
        return cls(**dict(zip(names, args, strict=False)))

    cases = [
        ((1, ["a"]), (1, ["b"])),  # a field left out of comparison
        ((1,), (2,)),
        ((1, [], "p"), (1, [], "q")),  # a field left out of the repr, still compared
        ((1, [], "p", 1.0), (1, [], "p", 2.0)),  # compared, but not hashed
    ]
    for left, right in cases:
        a, b = make(ours, *left), make(ours, *right)
        c, d = make(theirs, *left), make(theirs, *right)
        assert (a == b) is (c == d)
        assert (a != b) is (c != d)
        assert (a == a) is (c == c)
        if options.get("repr", True):
            assert repr(a) == repr(c).replace(theirs.__qualname__, ours.__qualname__)
        else:
            assert repr(a).startswith("<")  # object's own
        assert (ours.__hash__ is None) is (theirs.__hash__ is None)
        if theirs.__hash__ is not None and options.get("eq", True):
            assert (hash(a) == hash(b)) is (hash(c) == hash(d))
            assert hash(a) == hash(c)  # the same tuple of fields
    assert make(ours, 1) != make(theirs, 1)  # another class: never equal
    ours_sub, theirs_sub = type("Sub", (ours,), {}), type("Sub", (theirs,), {})
    assert (make(ours, 1) == make(ours_sub, 1)) is (make(theirs, 1) == make(theirs_sub, 1))
    assert make(ours, 1).__eq__(object()) is NotImplemented or not options.get("eq", True)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_a_record_keeps_what_a_dataclass_has(options: dict[str, Any]) -> None:
    ours, theirs = twins(**options)
    assert [f.name for f in dataclasses.fields(ours)] == [
        f.name for f in dataclasses.fields(theirs)
    ]
    assert getattr(ours, "__match_args__", None) == getattr(theirs, "__match_args__", None)
    assert hasattr(ours, "__slots__") is hasattr(theirs, "__slots__")
    point = ours(x=1, tags=["a"])
    moved = dataclasses.replace(point, x=2)
    assert (moved.x, moved.tags) == (2, ["a"])
    copied = copy.deepcopy(point)  # slotted and frozen classes copy through their state
    assert (copied.x, copied.tags, copied.label) == (point.x, point.tags, point.label)
    if options.get("frozen"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            point.x = 3
    else:
        point.x = 3
        assert point.x == 3


def test_what_the_class_body_defines_is_kept() -> None:
    @record(frozen=True, slots=True)
    class Named:
        name: str
        kind: str = "x"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Named) and other.name == self.name

        def __hash__(self) -> int:
            return hash(self.name)

        def __repr__(self) -> str:
            return f"<{self.name}>"

    assert Named("a", "x") == Named("a", "y")
    assert hash(Named("a", "x")) == hash(Named("a", "y"))
    assert repr(Named("a")) == "<a>"


def test_a_record_defining_only_eq_is_hashed_by_its_fields_when_frozen() -> None:
    """As `dataclass` does: defining `__eq__` alone leaves the generated hash to come."""

    @record(frozen=True)
    class Loose:
        a: int

        def __eq__(self, other: object) -> bool:
            return True

    @dataclasses.dataclass(frozen=True)
    class Twin:
        a: int

        def __eq__(self, other: object) -> bool:
            return True

    assert hash(Loose(1)) == hash(Twin(1)) == hash((1,))


def test_a_recursive_record_prints_without_recursing() -> None:
    @record
    class Node:
        children: list[Any]

    node = Node([])
    node.children.append(node)
    assert (
        repr(node)
        == "test_a_recursive_record_prints_without_recursing.<locals>.Node(children=[...])"
    )


def test_a_record_without_fields() -> None:
    @record(frozen=True)
    class Empty:
        pass

    assert Empty() == Empty()
    assert hash(Empty()) == hash(())
    assert repr(Empty()).endswith("Empty()")


INIT_OPTIONS: list[dict[str, Any]] = [
    {},
    {"frozen": True},
    {"slots": True},
    {"frozen": True, "slots": True},
    {"kw_only": True},
]


def init_twins(**options: Any) -> tuple[type, type]:
    """A class body with every kind of `__init__` field, made by `record` and `dataclass`."""

    def body(decorate: Any) -> type:
        @decorate(**options)
        class Job:
            name: str
            tries: int = 3
            tags: list[str] = dataclasses.field(default_factory=list)
            state: str = dataclasses.field(default="new", init=False)
            log: list[str] = dataclasses.field(default_factory=list, init=False)
            owner: str = dataclasses.field(default="ops", kw_only=True)
            seen: int = dataclasses.field(init=False, repr=False, compare=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "seen", len(self.tags))

        return Job

    return body(record), body(dataclasses.dataclass)


@pytest.mark.parametrize("options", INIT_OPTIONS, ids=str)
def test_a_records_init_takes_and_sets_what_the_dataclasss_does(options: dict[str, Any]) -> None:
    """`__init__` is compiled at the first instance: the same parameters, defaults,
    factories (a new value each time), `init=False` fields and `__post_init__`."""
    ours, theirs = init_twins(**options)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("a",), {}),
        (("a", 5), {}),
        (("a", 5, ["x", "y"]), {"owner": "dev"}),
        ((), {"name": "b", "tags": ["z"]}),
    ]
    if options.get("kw_only"):
        calls = [((), {"name": "a"}), ((), {"name": "a", "tries": 5, "owner": "dev"})]
    names = ("name", "tries", "tags", "state", "log", "owner", "seen")
    for args, kwargs in calls:
        a, b = ours(*args, **kwargs), theirs(*args, **kwargs)
        assert [getattr(a, n) for n in names] == [getattr(b, n) for n in names]
    first, second = ours(name="a"), ours(name="a")
    assert first.tags is not second.tags  # made per instance
    assert first.log is not second.log
    for args, kwargs in [((), {}), (("a", 1, [], "x"), {}), (("a",), {"state": "x"})]:
        with pytest.raises(TypeError) as mine:
            ours(*args, **kwargs)
        with pytest.raises(TypeError) as the_dataclass:
            theirs(*args, **kwargs)
        assert str(mine.value).split("() ", 1)[1] == str(the_dataclass.value).split("() ", 1)[1]
    assert ours.__init__.__qualname__ == f"{ours.__qualname__}.__init__"


def test_a_record_checks_its_field_order_when_defined() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @record(frozen=True)
        class Backwards:
            a: int = 1
            b: int  # type: ignore[misc]


def test_a_record_is_frozen_as_a_dataclass_is() -> None:
    @record(frozen=True, slots=True)
    class Pin:
        at: int

    pin = Pin(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'at'"):
        pin.at = 2
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'at'"):
        del pin.at
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):

        @record(frozen=True)
        class Loud:
            a: int

            def __setattr__(self, name: str, value: Any) -> None: ...

    @record(frozen=True)
    class Base:
        a: int

    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):

        @record
        class Thawed(Base):
            b: int

    @record(frozen=True)
    class Child(Base):
        b: int = 0

    child = Child(1, 2)
    assert (child.a, child.b) == (1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        child.a = 3


def test_a_record_takes_no_initvar() -> None:
    with pytest.raises(TypeError, match="InitVar"):

        @record
        class Hidden:
            secret: dataclasses.InitVar[str]


def test_a_field_named_self_is_a_parameter_like_any_other() -> None:
    @record
    class Odd:
        self: int

    assert Odd(self=3).self == 3
