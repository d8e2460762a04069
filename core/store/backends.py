"""Which backend a store target names: a path or a `sqlite:///…` URL is the embedded
SQLite store; `postgresql://…` is where the shared PostgreSQL store plugs in (SPEC §14)."""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError
from core.store.protocol import Store
from core.store.sqlite import SqliteStore

_KEY = "store"
_SQLITE_FIX = 'give a file path (`path = "~/.parley/parley.db"`) or `sqlite:///<path>`'


async def open_store(target: str | Path) -> Store:
    """Open the store `target` names, creating and migrating it on first use.

    Args:
        target: a filesystem path or a `sqlite:///<path>` URL (SQLite; after the three
            slashes a relative path, or a fourth slash for an absolute one).

    Raises:
        ConfigError: `target` is a URL of a backend this build has not got (PostgreSQL,
            for now) or of no known backend.
    """
    scheme, location = _parse(target)
    match scheme:
        case "sqlite":
            return await SqliteStore.open(location)
        case "postgresql" | "postgres":
            # The PostgreSQL backend opens here: the same `Store` protocol and schema.
            raise ConfigError(
                _KEY,
                "a PostgreSQL store is not available yet",
                "use SQLite for now: " + _SQLITE_FIX,
            )
        case _:
            raise ConfigError(_KEY, f"`{scheme}://` is not a store Parley knows", _SQLITE_FIX)


def _parse(target: str | Path) -> tuple[str, str]:
    """(backend scheme, location): a bare path is SQLite's."""
    if isinstance(target, Path) or "://" not in target:
        return "sqlite", str(target)
    scheme, rest = target.split("://", 1)
    scheme = scheme.lower().split("+", 1)[0]  # postgresql+asyncpg:// names PostgreSQL too
    if scheme == "sqlite":
        path = rest.removeprefix("/")
        if not rest.startswith("/") or not path:
            raise ConfigError(_KEY, f"`{target}` names no database file", _SQLITE_FIX)
        return scheme, path
    return scheme, rest
