"""Provider registry: wire-format name → class, imported lazily."""

from __future__ import annotations

import importlib

import httpx

from core.clock import Clock
from core.providers.base import Provider, ProviderSettings

KINDS = {
    "openai_chat": ("core.providers.openai_chat", "OpenAIChatProvider"),
    "openai_responses": ("core.providers.openai_responses", "OpenAIResponsesProvider"),
    "anthropic": ("core.providers.anthropic", "AnthropicProvider"),
}


def build_provider(
    settings: ProviderSettings,
    client: httpx.AsyncClient | None = None,
    clock: Clock | None = None,
) -> Provider:
    """Instantiate the provider class for `settings.kind`."""
    module_name, class_name = KINDS[settings.kind]
    cls: type[Provider] = getattr(importlib.import_module(module_name), class_name)
    return cls(settings, client, clock)


__all__ = ["KINDS", "Provider", "ProviderSettings", "build_provider"]
