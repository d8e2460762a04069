"""Tool search: with more than `[tools] search_threshold` tools from tools.yaml and MCP
servers, a request carries the built-in tools and `find_tools`, not every schema (150 MCP
tools are ~100 KB of JSON in every request).

`find_tools` takes a few words and answers with the best-matching tools' names and
one-line descriptions; from then on the run's requests carry those tools' full schemas
too. The set only grows within a run and keeps the order tools were found in, so a
provider's prompt cache stays valid from one request to the next. A run starts with the
tools its conversation already called (and those earlier `find_tools` calls found, by
running them again), so the history never names a tool its request lacks. A tool that
was not found can still be called by name: the executor runs whatever the registry
holds, through the same policy; it is offered from then on.

A tool the run's role refuses (docs/governance.md#roles) is never offered, found or
listed, with or without a search (`offered_specs`); called by name anyway, the executor
refuses it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from core.messages import Message
from core.tools.base import RoleGate, Tool, ToolContext, ToolRegistry, ToolResult, ToolSpec

FIND_TOOLS = "find_tools"
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def with_search(
    tools: Iterable[Tool], refused: Mapping[str, str] | None, threshold: int
) -> ToolRegistry:
    """A registry of `tools`, plus `find_tools` when more than `threshold` of them (0:
    never) are tools.yaml or MCP tools, which then wait to be found."""
    listed = [tool for tool in tools if tool.name != FIND_TOOLS]
    if threshold and sum(1 for t in listed if t.deferrable) > threshold:
        listed.append(FindToolsTool())
    return ToolRegistry(listed, refused)


def offers(role: RoleGate | None, tool: Tool) -> bool:
    """Whether a run of `role` (None: no role limits it) is offered `tool`: its role
    allows the tool's own category. A call escalated above it (a destructive `bash`
    command) is checked again when it is made."""
    return role is None or role.allows_tool(tool.name, tool.category)


def offered_specs(registry: ToolRegistry, role: RoleGate | None) -> tuple[ToolSpec, ...]:
    """What a run of `role` is offered of `registry`: every tool its role allows."""
    specs = registry.specs()
    if role is None:
        return specs
    tools = registry.tools()  # in the order of their specs
    return tuple(spec for tool, spec in zip(tools, specs, strict=True) if offers(role, tool))


@functools.lru_cache(maxsize=4096)
def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(_CAMEL.sub(" ", text).lower()))


def one_line(description: str, limit: int = 120) -> str:
    """The first sentence or line of a description, at most `limit` characters."""
    line = description.strip().split("\n", 1)[0]
    line = re.split(r"(?<=[.!?])\s", line, maxsplit=1)[0]
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


class ToolSearch:
    """One run's offered tools: the registry's built-ins, `find_tools`, and the
    deferrable tools found so far, each one the run's role allows (see the module
    docstring)."""

    def __init__(self, registry: ToolRegistry, role: RoleGate | None = None) -> None:
        self.registry = registry
        self.role = role
        self.found: list[str] = []
        self._specs: tuple[ToolSpec, ...] | None = None

    @staticmethod
    def wanted(registry: ToolRegistry) -> bool:
        """The registry holds more tools than it offers at once."""
        return registry.get(FIND_TOOLS) is not None

    def seed(self, messages: Sequence[Message]) -> ToolSearch:
        """Offer what the history already used: tools it called, and what its
        `find_tools` calls found."""
        for message in messages:
            for call in message.tool_calls:
                if call.name == FIND_TOOLS:
                    try:
                        args = FindToolsArgs.model_validate_json(call.arguments or "{}")
                    except ValueError:
                        continue
                    self.find(args.query, args.limit)
                else:
                    self.add([call.name])
        return self

    def add(self, names: Iterable[str]) -> None:
        for name in names:
            tool = self.registry.get(name)
            if tool is None or not offers(self.role, tool):
                continue
            if tool.deferrable and name not in self.found:
                self.found.append(name)
                self._specs = None

    def find(self, query: str, limit: int) -> list[Tool]:
        """The deferrable tools that best match `query`, now offered to the run."""
        wanted = _words(query)
        exact = query.strip()
        scored: list[tuple[float, int, Tool]] = []
        for index, tool in enumerate(self.registry.tools()):
            if not tool.deferrable or not offers(self.role, tool):
                continue
            if tool.name == exact:
                score = 1000.0
            else:
                name, text = _words(tool.name), _words(tool.description)
                score = 3.0 * len(wanted & name) + len(wanted & text)
                score += 0.5 * sum(1 for w in wanted for n in name if n.startswith(w) and n != w)
            if score > 0:
                scored.append((-score, index, tool))
        best = [tool for _, _, tool in sorted(scored)[:limit]]
        self.add(tool.name for tool in best)
        return best

    def hidden(self) -> list[Tool]:
        """Deferrable tools not offered yet (that the run's role allows)."""
        return [
            t
            for t in self.registry.tools()
            if t.deferrable and t.name not in self.found and offers(self.role, t)
        ]

    def specs(self) -> tuple[ToolSpec, ...]:
        """What this run's next request carries (one tuple per size of the found set)."""
        if self._specs is None:
            by_name = {spec.name: spec for spec in self.registry.specs()}
            always = [
                by_name[t.name]
                for t in self.registry.tools()
                if not t.deferrable and offers(self.role, t)
            ]
            self._specs = (*always, *(by_name[n] for n in self.found))
        return self._specs


class FindToolsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built if offered

    query: str = Field(
        min_length=1, max_length=200, description="What the tool should do, in a few words."
    )
    limit: int = Field(5, ge=1, le=20, description="How many tools to return at most.")


class FindToolsTool(Tool):
    """`find_tools`: search the tools not offered yet."""

    name = FIND_TOOLS
    description = (
        "Search the team's other tools (more than fit in one request) by what they do. "
        "Returns matching tool names with one-line descriptions; the tools found can be "
        "called right after, in the next step."
    )
    category = "read"
    params = FindToolsArgs

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, FindToolsArgs)
        search = ctx.search
        if search is None:
            return ToolResult("error: every tool is already offered in this run", is_error=True)
        found = search.find(args.query, args.limit)
        if not found:
            groups = sorted({t.name.rsplit("__", 1)[0] for t in search.hidden()})
            hint = f" Tool groups not offered yet: {', '.join(groups)}." if groups else ""
            return ToolResult(f"No tool matches `{args.query}`; try other words.{hint}")
        lines = [f"- {tool.name}: {one_line(tool.description)}" for tool in found]
        return ToolResult(f"Found {len(found)} tool(s), callable now:\n" + "\n".join(lines))


__all__ = [
    "FIND_TOOLS",
    "FindToolsTool",
    "ToolSearch",
    "offered_specs",
    "offers",
    "one_line",
    "with_search",
]
