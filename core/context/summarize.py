"""Summaries for compaction and TACO: one cheap LLM call, its input clipped to fit.

The summary model often has a smaller window than the main one, so its input is clipped
(the middle is cut, counted with our tokenizer and a margin) before the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from core.context.tokens import FRAMING_TOKENS, TokenCounter
from core.cost.call import side_call
from core.messages import Message
from core.providers.base import Provider

Summarizer = Callable[[str], Awaitable[str]]
"""Text in, summary out: one cheap LLM call (see `provider_summarizer`)."""

SUMMARIZER_SYSTEM = (
    "You compress text for an AI assistant's working memory. Follow the instructions in the "
    "user message. Preserve facts, names, file paths, numbers, ids, decisions, errors and open "
    "tasks. Answer with the compressed text only, no preamble."
)
SUMMARY_PROMPT = (
    "Summarise this earlier part of a conversation between a user and a tool-using assistant "
    "so the assistant can continue the work without it: the user's goals and requests, what "
    "was done and found, what failed, and what is still open.\n\n<conversation>\n{body}\n"
    "</conversation>"
)
TACO_PROMPT = (
    "Compress this output of the `{name}` tool to under {target} tokens. Keep all data values, "
    "file paths, exit codes and structured content; drop verbose headers and repetition.\n\n"
    "<output>\n{body}\n</output>"
)
SUMMARY_PROMPT_OVERHEAD = 200  # tokens of SUMMARY_PROMPT / TACO_PROMPT around the body
SUMMARY_WINDOW_MARGIN = 0.05  # of the summary model's window: its tokenizer is not ours


class ProviderSummarizer:
    """A `Summarizer` that makes one streamed call to `provider` and returns its text.

    The summary model often has a smaller window than the main one: its input is clipped
    (middle cut, counted with `counter`) to `max_input_tokens`, so the request always fits.
    """

    def __init__(self, provider: Provider, counter: TokenCounter | None = None) -> None:
        self.provider = provider
        self.counter = counter or TokenCounter()

    @property
    def max_input_tokens(self) -> int:
        """Tokens the user text may have: the provider's window minus its max output, the
        system prompt, framing and a margin (our tokenizer is not the provider's)."""
        settings = self.provider.settings
        window = settings.context_window
        overhead = self.counter.text(SUMMARIZER_SYSTEM) + 2 * FRAMING_TOKENS
        margin = int(window * SUMMARY_WINDOW_MARGIN)
        return max(0, window - settings.max_output_tokens - overhead - margin)

    async def __call__(self, text: str) -> str:
        text = clip_to_tokens(text, self.max_input_tokens, self.counter)
        request = [Message.system(SUMMARIZER_SYSTEM), Message.user(text)]
        # priced and held to the run's budgets like its own calls (docs/cost.md)
        done = await side_call(self.provider, request, self.counter)
        return done.message.content.strip()


def provider_summarizer(
    provider: Provider, counter: TokenCounter | None = None
) -> ProviderSummarizer:
    """A `ProviderSummarizer` for `provider` (see there)."""
    return ProviderSummarizer(provider, counter)


def clip_to_tokens(text: str, tokens: int, counter: TokenCounter) -> str:
    """`text` within `tokens` as `counter` counts them; an over-long text loses its middle,
    so the instructions at its start and the newest part at its end both stay."""
    if len(text.encode()) <= tokens:  # a token is at least one byte: no need to count
        return text
    if tokens <= 0:
        return ""
    keep = min(len(text), tokens * 8)  # chars: over 8 chars a token is rare
    for _ in range(6):
        clipped = _cut_middle(text, keep)
        used = counter.text(clipped)
        if used <= tokens:
            return clipped
        keep = int(keep * tokens / used * 0.95)
    # Never reached in practice. A token is at least one byte and a char at most four:
    # this many chars always fit.
    room = tokens - len(_cut_mark(len(text)).encode())
    return _cut_middle(text, room // 4) if room > 0 else text[: tokens // 4]


def _cut_middle(text: str, keep: int) -> str:
    if keep >= len(text):
        return text
    head = keep // 2
    tail = keep - head
    return text[:head] + _cut_mark(len(text) - keep) + (text[-tail:] if tail else "")


def _cut_mark(cut: int) -> str:
    return f"\n…[{cut} characters cut to fit the summary model's window]…\n"
