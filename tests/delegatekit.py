"""Scripting a parent run and its child runs on the fake LLM. Children call the model at
the same time, so a FIFO script cannot say who gets which reply: requests are told apart
by the child prompt in the system message and a key word of the child's instruction."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from core.agent.children import CHILD_PROMPT
from tests.fakes.llm import RecordedRequest, Reply, ToolCallSpec

Step = Reply | Callable[[], Awaitable[Reply]]
PARENT = "parent"


def delegate(*tasks: dict[str, Any] | str, call_id: str | None = None) -> ToolCallSpec:
    """A `delegate` call; a task given as a string is just its instruction."""
    specs = [{"instruction": t} if isinstance(t, str) else t for t in tasks]
    return ToolCallSpec("delegate", {"tasks": specs}, id=call_id)


@dataclass
class Scripts:
    """The fake LLM's responder: one queue of replies for the parent, one per child (keyed
    by a word its instruction contains). A step may be a coroutine function: the reply is
    sent when it returns (to hold one child until another has called)."""

    parent: deque[Step] = field(default_factory=deque)
    children: dict[str, deque[Step]] = field(default_factory=dict)
    requests: dict[str, list[RecordedRequest]] = field(default_factory=lambda: defaultdict(list))
    arrived: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))

    def child(self, key: str, *steps: Step) -> None:
        self.children.setdefault(key, deque()).extend(steps)

    def key_of(self, request: RecordedRequest) -> str:
        messages = request.json["messages"]
        if CHILD_PROMPT not in str(messages[0]["content"]):
            return PARENT
        instruction = next(str(m["content"]) for m in messages if m["role"] == "user")
        return next(k for k in self.children if k in instruction)

    async def __call__(self, request: RecordedRequest) -> Reply:
        key = self.key_of(request)
        self.requests[key].append(request)
        self.arrived[key].set()
        queue = self.parent if key == PARENT else self.children[key]
        if not queue:
            raise AssertionError(f"no reply scripted for {key} (request {len(self.requests[key])})")
        step = queue.popleft()
        return step if isinstance(step, Reply) else await step()

    def after(self, key: str, reply: Reply) -> Callable[[], Awaitable[Reply]]:
        """A step that answers `reply` once `key` has called the model."""

        async def wait() -> Reply:
            await asyncio.wait_for(self.arrived[key].wait(), 20)
            return reply

        return wait

    def tool_results(self, key: str, request: int = -1) -> dict[str, str]:
        """The tool results (by call id) in one of `key`'s requests."""
        messages = self.requests[key][request].json["messages"]
        return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}

    def tools_offered(self, key: str, request: int = 0) -> list[str]:
        return [t["function"]["name"] for t in self.requests[key][request].json.get("tools", [])]
