"""One conversation's history and what a turn needs (provider, tools, guards), and the
`Wiring` protocol through which the agent gets conversations from the application."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from core.events import EventSink, discard
from core.journal import JournalBox
from core.loop import Guards, LoopConfig, LoopOutcome, run_loop
from core.messages import Message
from core.providers.base import Provider
from core.tokens import TokenCounter
from core.tools.base import Approver
from core.tools.executor import ToolExecutor

if TYPE_CHECKING:
    from core.runs import RunRecorder


@dataclass(slots=True)
class Conversation:
    """One conversation's history and what it needs to run a turn."""

    provider: Provider
    executor: ToolExecutor
    system_prompt: str
    loop_config: LoopConfig = field(default_factory=LoopConfig)
    counter: TokenCounter = field(default_factory=TokenCounter)
    guards: Guards = field(default_factory=Guards)
    messages: list[Message] = field(default_factory=list)
    extra_system: Callable[[], str] | None = None  # journal digest, goal

    def stable_prompt(self) -> str:
        """The part of the system message that comes from configuration and tools; its
        hash tells a resumed run whether the ground shifted under it."""
        workspace = self.executor.ctx.sandbox.resolved_workspace()
        tools = ", ".join(self.executor.registry.names())
        return (
            f"{self.system_prompt}\n\nTools run in the working directory {workspace}. "
            f"Available tools: {tools}."
        )

    def prompt_hash(self) -> str:
        return hashlib.sha256(self.stable_prompt().encode()).hexdigest()[:16]

    def system_message(self) -> Message:
        """Rebuilt every turn: configuration, tools, today's date, journal digest, goal."""
        today = dt.datetime.now(dt.UTC).date().isoformat()
        text = f"{self.stable_prompt()} Today is {today} (UTC)."
        if self.extra_system is not None and (extra := self.extra_system()):
            text = f"{text}\n\n{extra}"
        return Message.system(text)

    def refresh_system(self) -> None:
        system = self.system_message()
        if self.messages and self.messages[0].role == "system":
            self.messages[0] = system
        else:
            self.messages.insert(0, system)

    async def turn(self, text: str, sink: EventSink = discard) -> LoopOutcome:
        """Add the user's message and run the loop until a final answer."""
        self.refresh_system()
        self.messages.append(Message.user(text))
        return await self.run(sink)

    async def run(
        self, sink: EventSink = discard, recorder: RunRecorder | None = None
    ) -> LoopOutcome:
        return await run_loop(
            self.messages,
            self.provider,
            self.executor,
            config=self.loop_config,
            sink=sink,
            counter=self.counter,
            guards=self.guards,
            recorder=recorder,
        )


class Wiring(Protocol):
    """What the agent needs from the application: providers and conversations."""

    @property
    def default_provider(self) -> str: ...

    @property
    def generation(self) -> int:
        """Bumped by a configuration reload: conversations are rebuilt before their next
        turn."""

    def provider_names(self) -> list[str]: ...

    def provider(self, name: str) -> Provider: ...

    def conversation(
        self, provider_name: str, approver: Approver | None, journal: JournalBox
    ) -> Conversation: ...
