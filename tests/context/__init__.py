"""Shared helpers for the context-pressure tests: a word counter and sized messages."""

from __future__ import annotations

from core.context.tokens import FRAMING_TOKENS, TokenCounter
from core.events import LoopEvent, Observed
from core.messages import Message, ToolCall


class WordCounter(TokenCounter):
    """One token per word (+4 framing per message), so sizes are known exactly.

    `message_calls` counts how often a message was counted (cached or not, exactly or by
    the cheap upper bound).
    """

    def __init__(self) -> None:
        super().__init__()
        self.exact = True
        self.message_calls = 0

    def text(self, text: str) -> int:
        return len(text.split())

    def message(self, message: Message) -> int:
        self.message_calls += 1
        return super().message(message)

    def upper_bound(self, message: Message) -> int:
        self.message_calls += 1
        return super().upper_bound(message)


def words(n: int, tag: str = "w") -> str:
    return " ".join([tag] * n)


def user(tokens: int, tag: str = "u") -> Message:
    """A user message of exactly `tokens` tokens under `WordCounter`."""
    return Message.user(words(tokens - FRAMING_TOKENS, tag))


def reply(tokens: int, tag: str = "a") -> Message:
    return Message.assistant(words(tokens - FRAMING_TOKENS, tag))


def system(tokens: int) -> Message:
    return Message.system(words(tokens - FRAMING_TOKENS, "s"))


def tool_turn(
    call_id: str, name: str, result_tokens: int, *, error: bool = False, tag: str = "r"
) -> list[Message]:
    """An assistant message with one call (6 tokens) and its result."""
    call = ToolCall(id=call_id, name=name, arguments="{}")
    result = Message.tool_result(call, words(result_tokens - FRAMING_TOKENS, tag), is_error=error)
    return [Message.assistant("", (call,)), result]


class Sink:
    """Collects events; `named(x)` returns the data of the `Observed` events named x."""

    def __init__(self) -> None:
        self.events: list[LoopEvent] = []

    def __call__(self, event: LoopEvent) -> None:
        self.events.append(event)

    def named(self, name: str) -> list[dict[str, object]]:
        return [e.data for e in self.events if isinstance(e, Observed) and e.name == name]
