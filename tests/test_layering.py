"""core/ is channel-agnostic: it imports no platform SDK and nothing from channels/ or bot/;
channels/ reach the agent only through its port."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"
FORBIDDEN = {"slack_bolt", "slack_sdk", "discord", "telegram", "channels", "bot", "aiohttp"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_imports_no_platform_sdk() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10
    leaks = {str(f.relative_to(CORE)): imported_roots(f) & FORBIDDEN for f in files}
    assert {f: bad for f, bad in leaks.items() if bad} == {}


def test_channels_reach_the_agent_only_through_its_port() -> None:
    """Every adapter, the console included, talks to `core.chat.AgentPort`, never to the
    concrete agent or its lanes, commands or loop."""
    inner = {"core.agent", "core.commands", "core.loop", "core.goals", "core.store"}
    files = sorted((CORE.parent / "channels").glob("*.py"))
    assert len(files) > 10
    leaks = {}
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        leaks[path.name] = sorted(m for m in modules if m in inner)
    assert {f: bad for f, bad in leaks.items() if bad} == {}
