"""One conversation's history and what a turn needs (provider, tools, guards), and the
`ConversationFactory` protocol through which the agent gets conversations from the application."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections.abc import Collection
from dataclasses import field
from pathlib import Path
from typing import Protocol

from core.agent.journal import JournalBox
from core.chat import ConversationKey
from core.context.manager import ContextManager
from core.context.tokens import TokenCounter
from core.instructions import Guidance
from core.loop import Guards, LoopConfig, LoopOutcome, run_loop
from core.memory.recall import SYSTEM_NOTE as MEMORY_NOTE
from core.messages import TURN_MARK, Message, forget_wire_json
from core.providers.base import Provider
from core.providers.failover import FailoverProvider
from core.records import record
from core.run_context import DETACHED, RunContext
from core.sandbox import ToolSite
from core.tools.executor import ToolExecutor


@record(slots=True)
class Conversation:
    """One conversation's history and what it needs to run a turn."""

    provider: Provider
    executor: ToolExecutor
    system_prompt: str
    loop_config: LoopConfig = field(default_factory=LoopConfig)
    counter: TokenCounter = field(default_factory=TokenCounter)
    guards: Guards = field(default_factory=Guards)
    messages: list[Message] = field(default_factory=list)
    # Where its tools work (set by each run: workspace_scope); None: the workspace root.
    workspace: Path | None = None
    # The instruction files and skills index of its configuration, fixed when it is built
    # (`core.instructions`): a change of those files reaches the next turn, never this one.
    instructions: str = ""
    skills: str = ""

    def place(self, site: ToolSite) -> None:
        """Work at `site` from the next run on: the system message names its workspace,
        and results the context manager offloads go to its artifacts (which the run's
        tools may read, and no other conversation's)."""
        self.workspace = site.workspace
        if isinstance(self.guards.context, ContextManager):
            self.guards.context.artifacts_dir = site.artifacts

    def _head(self) -> str:
        workspace = self.workspace or self.executor.ctx.sandbox.resolved_workspace()
        return f"{self.system_prompt}\n\nTools run in the working directory {workspace}."

    def _guidance(self) -> list[str]:
        """The instruction files' part and, where `load_skill` is offered, the skills'."""
        parts = [self.instructions] if self.instructions else []
        if self.skills and self.executor.registry.get("load_skill") is not None:
            parts.append(self.skills)
        return parts

    def stable_prompt(self) -> str:
        """The part of the system message that comes from configuration and tools; its
        hash tells a resumed run whether the ground shifted under it."""
        return "\n\n".join([self._head(), *self._guidance()])

    def prompt_hash(self) -> str:
        """The stable prompt and the tool set (the model sees the tools with every
        request, so the system message need not list them)."""
        tools = ",".join(self.executor.registry.names())
        return hashlib.sha256(f"{self.stable_prompt()}\0{tools}".encode()).hexdigest()[:16]

    def system_message(self, extra: str = "") -> Message:
        """Rebuilt every turn: configuration, tools, today's date, the instruction files
        and skills (as of the start of the turn), what a block of recalled memories is
        (where memory is on), and `extra` (the journal digest and the goal, from the
        agent)."""
        today = dt.datetime.now(dt.UTC).date().isoformat()
        parts = [self._head(), *self._guidance()]
        if self.executor.ctx.memory is not None:
            parts.append(MEMORY_NOTE)
        # What changes from turn to turn comes last, after the cached prefix (docs/cost.md).
        volatile = "\n\n".join([f"Today is {today} (UTC).", *([extra] if extra else [])])
        return _shared_system("\n\n".join(parts) + TURN_MARK + volatile)

    def refresh_system(self, extra: str = "") -> None:
        system = self.system_message(extra)
        if self.messages and self.messages[0].role == "system":
            self.messages[0] = system
        else:
            self.messages.insert(0, system)

    async def turn(self, text: str, ctx: RunContext = DETACHED) -> LoopOutcome:
        """Add the user's message and run the loop until a final answer."""
        self.refresh_system()
        self.messages.append(Message.user(text))
        return await self.run(ctx)

    async def run(self, ctx: RunContext = DETACHED) -> LoopOutcome:
        """Run the loop over the history for the run `ctx` describes."""
        if isinstance(self.provider, FailoverProvider):  # each turn starts on its own
            self.provider.begin_turn()
        try:
            return await run_loop(
                self.messages,
                self.provider,
                self.executor,
                ctx,
                config=self.loop_config,
                counter=self.counter,
                guards=self.guards,
            )
        finally:
            forget_wire_json(self.messages)  # the conversation may now sit idle


@functools.lru_cache(maxsize=1)
def _shared_system(text: str) -> Message:
    """The system message of `text`: the one built last if it says the same. Most
    conversations of a worker have the same (no goal, no journal yet): a thousand held
    conversations then hold one copy, not a thousand, and an unchanged one keeps its
    counted tokens from turn to turn. Messages are frozen, so sharing is safe."""
    return Message.system(text)


class ConversationFactory(Protocol):
    """What the agent needs from the application: providers and conversations."""

    @property
    def default_provider(self) -> str: ...

    @property
    def generation(self) -> int:
        """Bumped by a configuration reload: conversations are rebuilt before their next
        turn."""

    @property
    def guidance(self) -> Guidance:
        """The instruction files and skills as last read (see `refresh`)."""

    def refresh(self) -> None:
        """Between turns: read the configuration files again that changed since they were
        last read (a change bumps `generation`)."""

    def approvers(self, channel: str) -> Collection[str] | None:
        """Who may decide on `channel` (choose its chats' instructions); None: everyone
        there may (the terminal console)."""

    def provider_names(self) -> list[str]: ...

    def tool_status(self) -> list[str]:
        """Lines for `/status` about tool sources that can fail (MCP servers)."""

    def provider(self, name: str) -> Provider: ...

    def conversation(
        self, provider_name: str, journal: JournalBox, *, key: ConversationKey | None = None
    ) -> Conversation:
        """A conversation of `provider_name`'s; with `key`, the one that conversation key
        runs (a trigger's conversation has the trigger's policy and provider)."""
        ...
