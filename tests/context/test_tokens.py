"""Token counting works offline, is cached per message, and falls back to chars/4."""

from __future__ import annotations

import socket

import pytest
import tiktoken.registry

from core.context.tokens import TokenCounter
from core.messages import Message, ToolCall


def test_encoding_loads_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("token counting tried to use the network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    # tiktoken caches loaded encodings per process: start empty so the load happens here.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    counter = TokenCounter()
    assert counter.text("hello world") == 2  # cl100k_base: "hello", " world"
    assert counter.exact


def test_message_count_is_cached_on_the_message() -> None:
    counter = TokenCounter()
    message = Message.assistant(
        "some text " * 50, (ToolCall(id="1", name="bash", arguments='{"command": "ls"}'),)
    )
    first = counter.message(message)
    assert first > 100
    assert message._tokens == first
    assert counter.messages([message, message]) == 2 * first


def test_fallback_is_chars_over_four_plus_framing() -> None:
    counter = TokenCounter(encoding="no_such_encoding")
    assert counter.text("x" * 400) == 100
    assert not counter.exact
    assert counter.message(Message.user("x" * 400)) == 100 + 4  # 16 chars of framing


def test_upper_bound_is_never_below_the_exact_count() -> None:
    counter = TokenCounter()
    samples = [
        "",
        "hello world",
        "日本語のテキスト",
        "🙂" * 50,
        "def f(x):\n    return x ** 2\n" * 20,
        "aaaa" * 500,
        " \n\t" * 100,
    ]
    for text in samples:
        call = ToolCall(id="1", name="bash", arguments='{"command": "ls -la"}')
        for message in (Message.user(text), Message.assistant(text, (call,))):
            assert counter.upper_bound(message) >= counter.message(message)
