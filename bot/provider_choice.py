"""Which configured LLM provider a command can use (`parley chat`, `parley run`): one whose
key is set (unless it runs locally) and whose server answers; else what to set.

Asked once at start-up, before anything is built on a provider, so that a missing key or
an unreachable server is a clear message naming the variables, not a failed first turn.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from bot.wiring import LOCAL_HOSTS
from core.config import CoreConfig


def provider_problem(
    config: CoreConfig, environ: Mapping[str, str], name: str, *, probe: bool = True
) -> str | None:
    """Why provider `name` cannot be used right now, or None."""
    cfg = config.providers[name]
    settings = cfg.settings(name, environ)
    url = urlsplit(settings.base_url)
    host = url.hostname or ""
    if cfg.api_key_env and not settings.api_key and host not in LOCAL_HOSTS:
        return f"{cfg.api_key_env} is not set"
    if not probe:
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        return f"cannot reach {settings.base_url} ({exc.strerror or exc})"
    return None


def choose_provider(
    config: CoreConfig, environ: Mapping[str, str], wanted: str | None = None
) -> tuple[str | None, dict[str, str]]:
    """The wanted (or default) provider if usable, else the first usable one; and the
    problems of those found unusable, by name."""
    first = wanted or config.default_provider
    order = [first, *(n for n in config.providers if n != first)]
    problems: dict[str, str] = {}
    for name in order:
        problem = provider_problem(config, environ, name)
        if problem is None:
            return name, problems
        problems[name] = problem
        if wanted:
            break
    return None, problems


def how_to_configure(config: CoreConfig) -> str:
    """The exact environment variables a user can set to get a working provider."""
    lines = []
    for name, cfg in config.providers.items():
        names = [v for v in (cfg.api_key_env, cfg.base_url_env, cfg.model_env) if v]
        if names:
            lines.append(f"  {name} ({cfg.kind}): " + ", ".join(names))
    return "\n".join(lines)
