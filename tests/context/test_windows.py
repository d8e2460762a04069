"""The context-window catalog: explicit → exact → longest prefix → substring → 8192."""

from __future__ import annotations

import pytest

from core.context.windows import FALLBACK_WINDOW, catalog, context_window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128000),
        ("gpt-4o-mini", 128000),
        ("GPT-4o-mini-2024-07-18", 128000),
        ("gpt-4.1-nano", 1047576),
        ("o1", 200000),
        ("o1-mini-2024-09-12", 128000),  # the longer prefix beats "o1"
        ("o4-mini", 200000),
        ("gpt-5-mini", 400000),
        ("gpt-4", 8192),
        ("gpt-4-turbo-2024-04-09", 128000),  # longer prefix beats "gpt-4-"
        ("claude-3-5-haiku-latest", 200000),
        ("claude-sonnet-4-20250514", 200000),
        ("claude-opus-4-1", 200000),
        ("llama3.1:8b", 131072),
        ("llama3.2", 131072),
        ("meta-llama/Llama-3.3-70B-Instruct", 131072),  # substring
        ("qwen2.5-coder:14b", 32768),
        ("mistral-large-latest", 131072),
        ("mistral", 32768),
        ("deepseek-chat", 65536),
        ("deepseek-reasoner", 65536),
        ("gemini-1.5-pro-002", 2097152),
        ("gemini-2.5-flash", 1048576),
        ("openrouter/openai/gpt-4o", 128000),  # the name after the last "/"
    ],
)
def test_catalog_matches(model: str, window: int) -> None:
    assert context_window(model) == window


def test_explicit_wins_and_unknown_falls_back() -> None:
    assert context_window("gpt-4o", 4096) == 4096
    assert context_window("my-local-model") == FALLBACK_WINDOW
    assert context_window("my-local-model", None) == 8192


def test_match_kinds_in_order() -> None:
    cat = catalog()
    assert cat is catalog()  # parsed once
    assert "gpt-4o" in cat.exact
    prefixes = [key for key, _ in cat.prefix]
    assert prefixes == sorted(prefixes, key=lambda k: (-len(k), k))
    # "deepseek" only as a substring: a vendor-prefixed name still matches.
    assert context_window("accounts/fireworks/models/deepseek-v2") == 65536
