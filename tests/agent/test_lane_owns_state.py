"""`Lane` owns its state: no module but lane.py assigns to a lane's attributes (they
change through its verbs), and its fields cannot be set from outside."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.agent.journal import JournalBox
from core.agent.lane import Lane

ROOT = Path(__file__).resolve().parents[2]


def _lane_assignments(path: Path) -> list[str]:
    """`lane.x = …`, `self.lane.x += …` and the like in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        flat = [t for target in targets for t in ast.walk(target)]
        for target in flat:
            if not isinstance(target, ast.Attribute) or not isinstance(target.ctx, ast.Store):
                continue
            base = target.value
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            if name == "lane":
                found.append(f"{path}:{node.lineno}: lane.{target.attr}")
    return found


def test_no_module_but_lane_py_assigns_a_lanes_fields() -> None:
    lane_py = ROOT / "core" / "agent" / "lane.py"
    found = [
        hit
        for package in ("core", "bot", "channels")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != lane_py
        for hit in _lane_assignments(path)
    ]
    assert found == []


def test_the_check_sees_an_assignment(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(lane, self):\n    lane.goal = None\n    self.lane.users += 1\n")
    assert [h.split(": ")[1] for h in _lane_assignments(sample)] == ["lane.goal", "lane.users"]


def test_a_lanes_fields_are_read_only_from_outside() -> None:
    lane = Lane(("t", "c", ""), "t:c", JournalBox())
    with pytest.raises(AttributeError):
        lane.goal = None  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lane.fresh_field = 1  # type: ignore[attr-defined]
