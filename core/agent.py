"""A conversation: history, the system message rebuilt each turn, and one turn at a time.

The durable per-conversation lane (queue, commands, runs, checkpoints) builds on this.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from core.events import EventSink, discard
from core.loop import Guards, LoopConfig, LoopOutcome, run_loop
from core.messages import Message
from core.providers.base import Provider
from core.tokens import TokenCounter
from core.tools.executor import ToolExecutor


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

    def system_message(self) -> Message:
        """Rebuilt every turn from config and the tool sandbox."""
        workspace = self.executor.ctx.sandbox.resolved_workspace()
        today = dt.datetime.now(dt.UTC).date().isoformat()
        return Message.system(
            f"{self.system_prompt}\n\nTools run in the working directory {workspace}. "
            f"Today is {today} (UTC)."
        )

    async def turn(self, text: str, sink: EventSink = discard) -> LoopOutcome:
        """Add the user's message and run the loop until a final answer."""
        system = self.system_message()
        if self.messages and self.messages[0].role == "system":
            self.messages[0] = system
        else:
            self.messages.insert(0, system)
        self.messages.append(Message.user(text))
        return await run_loop(
            self.messages,
            self.provider,
            self.executor,
            config=self.loop_config,
            sink=sink,
            counter=self.counter,
            guards=self.guards,
        )
