"""LLM providers: the `Provider` seam, the HTTP provider and its wire formats, a registry.

The registry maps a configured `kind` to its wire format, imported lazily; every kind
is served by the one `HTTPProvider` (endpoint, retries, error mapping, assembly).
"""

from __future__ import annotations

import importlib

import httpx2

from core.clock import Clock
from core.providers.base import Provider, ProviderSettings, WireFormat
from core.providers.http import HTTPProvider

KINDS = {
    "openai_chat": ("core.providers.openai_chat", "OPENAI_CHAT"),
    "openai_responses": ("core.providers.openai_responses", "OPENAI_RESPONSES"),
    "anthropic": ("core.providers.anthropic", "ANTHROPIC"),
}


def wire_format(kind: str) -> WireFormat:
    """The wire format of a configured `kind` (`KINDS`)."""
    module_name, attribute = KINDS[kind]
    wire: WireFormat = getattr(importlib.import_module(module_name), attribute)
    return wire


def build_provider(
    settings: ProviderSettings,
    client: httpx2.AsyncClient | None = None,
    clock: Clock | None = None,
) -> HTTPProvider:
    """The provider for `settings.kind`; it owns its HTTP client unless given one."""
    return HTTPProvider(settings, wire_format(settings.kind), client, clock)


__all__ = [
    "KINDS",
    "HTTPProvider",
    "Provider",
    "ProviderSettings",
    "WireFormat",
    "build_provider",
    "wire_format",
]
