"""Bytes of tool schemas per request with a 150-tool MCP server, with and without tool
search (`core/tools/search.py`).

The server is `tests/mcp/server.py --many 150 --bare`, written with the `mcp` SDK,
started over stdio through the application as a user configures it (in the sandbox where
the kernel has Landlock). Each row is one request of a run: the tools' JSON as each wire
format sends it (Chat Completions, Responses, Anthropic Messages), before any tool is
found, then after each `find_tools` call (5 tools each). The goal: under 12 KB until tools
are found. It also times one `find_tools` search over the 150 tools.

Run from the repo root: `.venv/bin/python benchmarks/tool_search.py [--quick]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.app import App, build_registry  # noqa: E402
from bot.config import parse_config  # noqa: E402
from core.providers.anthropic import anthropic_tool  # noqa: E402
from core.providers.openai_chat import chat_tool  # noqa: E402
from core.providers.openai_responses import responses_tool  # noqa: E402
from core.tools.base import ToolSpec  # noqa: E402
from core.tools.search import ToolSearch  # noqa: E402

SERVER = REPO / "tests" / "mcp" / "server.py"
GOAL = 12 * 1024
QUERIES = ("create issue", "close milestone", "assign project", "search comment")
WIRES = (("Chat", chat_tool), ("Responses", responses_tool), ("Anthropic", anthropic_tool))


def config(state: Path, threshold: int, tools: int) -> Any:
    return parse_config(
        {
            "default_provider": "p",
            "providers": {
                "p": {"kind": "openai_chat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
            },
            "store": {"path": str(state / "parley.db"), "events_log": None},
            "tools": {
                "workspace": str(state / "ws"),
                "artifacts_dir": str(state / "artifacts"),
                "tools_file": None,
                "search_threshold": threshold,
            },
            "mcp": {
                "servers": {
                    "tracker": {
                        "command": [sys.executable, str(SERVER), "--many", str(tools), "--bare"],
                        "read_paths": sorted({sys.prefix, sys.base_prefix}),
                        "default": "read",
                    }
                }
            },
        }
    )


def size(specs: tuple[ToolSpec, ...], convert: Any) -> int:
    return len(json.dumps([convert(spec) for spec in specs]).encode())


def row(label: str, specs: tuple[ToolSpec, ...]) -> str:
    cells = [f"{size(specs, convert):,} B" for _, convert in WIRES]
    return f"| {label} | {len(specs)} | " + " | ".join(cells) + " |"


async def measure(tools: int, rounds: int) -> list[str]:
    lines = [
        f"| request ({tools}-tool MCP server) | tools sent | "
        + " | ".join(name for name, _ in WIRES)
        + " |",
        "|---|---:|" + "---:|" * len(WIRES),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        everything = await registry_of(config(state, 0, tools))
        lines.append(row("search off (`search_threshold = 0`)", everything.specs()))
        registry = await registry_of(config(state, 30, tools))
        search = ToolSearch(registry)
        first = search.specs()
        lines.append(row("search on: first request", first))
        for n, query in enumerate(QUERIES, 1):
            search.find(query, 5)
            lines.append(row(f"after {n} `find_tools` call{'s' * (n > 1)}", search.specs()))
        started = time.perf_counter()
        for _ in range(rounds):
            ToolSearch(registry).find("update the team's roadmap", 5)
        per_find = (time.perf_counter() - started) / rounds * 1e6
    verdict = "under" if all(size(first, c) < GOAL for _, c in WIRES) else "OVER"
    lines += [
        "",
        f"first request {verdict} the 12 KB goal in every wire format; "
        f"one `find_tools` search over {tools} tools: {per_find:,.0f} µs",
    ]
    return lines


async def registry_of(cfg: Any) -> Any:
    app = App(cfg, {"PATH": "/usr/bin:/bin"}, build_registry(cfg, {}))
    await app.start_mcp()
    try:
        return app.registry
    finally:
        await app.stop_mcp()
        await app.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds")
    parser.add_argument("--tools", type=int, default=150)
    args = parser.parse_args()
    for line in asyncio.run(measure(args.tools, 20 if args.quick else 500)):
        print(line)


if __name__ == "__main__":
    main()
