"""core/ is channel-agnostic: it imports no platform SDK and nothing from channels/ or bot/;
channels/ reach the agent only through its port."""

from __future__ import annotations

import ast
import subprocess
import sys
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


PACKAGES = ("core", "channels", "bot")
ROOT = CORE.parent


def module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Every import of our own modules, wherever it is written: at the top, inside a
    function, or under `if TYPE_CHECKING:` (a cycle hidden there is still a cycle)."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` depends on the submodule (a package's
                # __init__ runs before any of its submodules, so that edge is not a cycle)
                subs = [f"{node.module}.{a.name}" for a in node.names]
                candidates = [s for s in subs if s in modules]
                if len(candidates) < len(subs):  # some names come from the module itself
                    candidates.append(node.module)
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            found |= {c for c in candidates if c in modules and c != name}
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_hidden_or_not() -> None:
    graph = import_graph()
    assert len(graph) > 40
    assert cycles(graph) == []


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


IMPORT_ALONE = """
import importlib, sys
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("core", "channels", "bot")]:
        del sys.modules[loaded]  # none of ours imported before it; libraries stay cached
    try:
        importlib.import_module(name)
    except Exception as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
"""


def test_each_module_imports_alone() -> None:
    names = sorted(n for n in module_files() if not n.endswith("__main__"))
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALONE, *names], cwd=ROOT, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, "")


# What an adapter (channels/*) may import of core: the channel-agent contract and the few
# platform-free helpers every adapter needs. Anything else (core.agent and its lanes, the
# store, the loop, the tools) is the agent's inside, reached only through `AgentPort`.
CHANNEL_CONTRACT = {
    "core.chat": "the contract itself: Inbound, Responder, reply streams, AgentPort",
    "core.events": "the loop events a reply stream is fed",
    "core.errors": "the errors both sides raise (DeliveryFailed, ChannelError, ...)",
    "core.command_table": "the chat commands every adapter registers and recognises",
    "core.lease": "Singleton: what a channel leaves to leases (Channel.singletons)",
    "core.clock": "time for throttles and retries (tests inject one)",
    "core.secrets": "the scrub applied to everything posted",
    "core.fence": "admit: no platform call for a run this worker no longer holds",
    "core.metrics": "platform API calls and retries counted (channels/retry.py)",
    "core.tracing": "a span per platform call under the run's trace (channels/retry.py)",
    "core.records": "`record`, how Parley defines its value classes (dataclasses)",
}


def imported_modules(source: str, modules: set[str]) -> set[str]:
    """Our modules that `source` imports, wherever the import is written: `from a.b import c`
    counts as `a.b.c` when that is a module of ours, else as `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def beyond_the_contract(source: str, modules: set[str]) -> list[str]:
    """What `source` (an adapter) imports of core beyond `CHANNEL_CONTRACT`, or of bot/."""
    return sorted(
        name
        for name in imported_modules(source, modules)
        if name.split(".")[0] in ("core", "bot") and name not in CHANNEL_CONTRACT
    )


def test_channels_reach_the_agent_only_through_the_contract() -> None:
    """Every adapter, the console included, imports of core only the modules listed in
    `CHANNEL_CONTRACT`: never the concrete agent, its lanes, commands, store or loop."""
    modules = set(module_files())
    files = sorted((ROOT / "channels").rglob("*.py"))
    assert len(files) > 10
    leaks = {
        str(path.relative_to(ROOT)): beyond_the_contract(path.read_text(), modules)
        for path in files
    }
    assert {f: bad for f, bad in leaks.items() if bad} == {}


def test_the_contract_check_sees_a_reach_into_the_agent() -> None:
    modules = set(module_files())
    source = """
from core.chat import Inbound
from core.agent.lane import Lane
from core import store
import core.loop
def later():
    from core.agent import Agent
    from bot.app import App
"""
    assert beyond_the_contract(source, modules) == [
        "bot.app",
        "core.agent",
        "core.agent.lane",
        "core.loop",
        "core.store",
    ]
    assert all(name in modules for name in CHANNEL_CONTRACT)


# --- the three rooms of the tools (docs/architecture.md): the wall, the seatbelt, the catalogue

# What the seatbelt may import beyond its own modules: pure computation only. No `os`,
# `subprocess`, `asyncio`, sockets, files, the store or the sandbox: a verdict is a function
# of the command and what the caller passes in.
SEATBELT_MAY_IMPORT = {
    "__future__", "re", "functools", "itertools", "typing", "collections", "dataclasses",
    "contextvars", "threading", "importlib", "tree_sitter", "tree_sitter_bash", "core.records",
}  # fmt: skip


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports (with `from a import b`: `a`), wherever it is written."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def outside_the_seatbelt(path: Path) -> list[str]:
    return sorted(
        name
        for name in imports_of(path)
        if not name.startswith("core.seatbelt")
        and name not in SEATBELT_MAY_IMPORT
        and name.split(".")[0] not in SEATBELT_MAY_IMPORT
    )


def test_the_seatbelt_only_computes() -> None:
    files = sorted((CORE / "seatbelt").glob("*.py"))
    assert len(files) > 5
    leaks = {f.name: outside_the_seatbelt(f) for f in files}
    assert {name: bad for name, bad in leaks.items() if bad} == {}


def test_the_seatbelt_check_sees_io(tmp_path: Path) -> None:
    rule = tmp_path / "rule.py"
    rule.write_text("import os\nfrom core.sandbox import Jail\nfrom core.tools.base import Tool\n")
    assert outside_the_seatbelt(rule) == ["core.sandbox", "core.tools.base", "os"]


def inner_sandbox_imports(path: Path) -> list[str]:
    """The wall's inner modules `path` imports (its API is the package: `core.sandbox`)."""
    return sorted(name for name in imports_of(path) if name.startswith("core.sandbox."))


def test_only_the_walls_api_is_imported_from_outside_it() -> None:
    sandbox = CORE / "sandbox"
    files = [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(sandbox)
    ]
    leaks = {str(f.relative_to(ROOT)): inner_sandbox_imports(f) for f in files}
    assert {f: bad for f, bad in leaks.items() if bad} == {}
    # and its API names every module it lends a name from
    import core.sandbox

    for name in core.sandbox.__all__:
        assert getattr(core.sandbox, name) is not None


def test_the_wall_imports_nothing_of_the_tools_the_agent_or_the_channels() -> None:
    files = sorted((CORE / "sandbox").glob("*.py"))
    assert len(files) > 10
    forbidden = ("core.tools", "core.agent", "core.seatbelt", "channels", "bot")
    leaks = {f.name: sorted(n for n in imports_of(f) if n.startswith(forbidden)) for f in files}
    assert {name: bad for name, bad in leaks.items() if bad} == {}


def test_the_room_checks_see_a_reach_inside(tmp_path: Path) -> None:
    caller = tmp_path / "caller.py"
    caller.write_text("from core.sandbox import Jail\nfrom core.sandbox.jail import Spawn\n")
    assert inner_sandbox_imports(caller) == ["core.sandbox.jail"]
