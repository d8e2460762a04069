"""Which backend a store target names: a path or a `sqlite:///…` URL is the embedded
SQLite store; `postgresql://…` (or `postgres://…`) is the PostgreSQL store that several
workers share (docs/scale-out.md). The PostgreSQL driver is imported only when one is opened."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qs, urlsplit

from core.errors import ConfigError

if TYPE_CHECKING:
    from core.store.protocol import Store

KEY = "store.url"
_FIX = (
    'give a SQLite file path or a PostgreSQL URL: `path = "~/.parley/parley.db"`, '
    '`url = "sqlite:///<path>"` or `url = "postgresql://USER@HOST:5432/DATABASE"`'
)
_POSTGRES_SCHEMES = ("postgresql", "postgres")
_POSTGRES_FIX = (
    'name both: `url = "postgresql://USER@HOST:5432/DATABASE"` (a socket directory as '
    "`?host=/var/run/postgresql`)"
)


async def open_store(target: str | Path, *, password: str | None = None) -> Store:
    """Open the store `target` names, creating and migrating it on first use.

    Args:
        target: a filesystem path or a `sqlite:///<path>` URL (SQLite; after the three
            slashes a relative path, or a fourth slash for an absolute one), or a
            `postgresql://USER@HOST:PORT/DATABASE` URL (libpq's form; `?options=-csearch_path%3DS`
            picks a schema).
        password: the PostgreSQL password (never part of the URL); SQLite ignores it.

    Raises:
        ConfigError: `target` names no backend Parley knows, is malformed, needs the
            PostgreSQL extra that is not installed, or names a server that cannot be
            reached or refuses us.
    """
    scheme, location = parse_target(target)
    if scheme == "sqlite":
        from core.store.sqlite import SqliteStore  # loaded when a store is opened

        return await SqliteStore.open(location)
    try:
        from core.store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            KEY,
            f"PostgreSQL support is not installed ({exc.name} is missing)",
            "install it with `pip install 'parley[postgres]'`",
        ) from exc
    return await PostgresStore.open(location, password=password)


def parse_target(target: str | Path) -> tuple[Literal["sqlite", "postgresql"], str]:
    """(`sqlite` or `postgresql`, the path or URL to open): a bare path is SQLite's.

    Raises:
        ConfigError: a URL of no backend Parley knows, or a `sqlite://` URL naming no file.
    """
    if isinstance(target, Path) or "://" not in target:
        return "sqlite", str(target)
    scheme, rest = target.split("://", 1)
    scheme = scheme.lower().split("+", 1)[0]  # postgresql+psycopg:// names PostgreSQL too
    if scheme == "sqlite":
        path = rest.removeprefix("/")
        if not rest.startswith("/") or not path:
            raise ConfigError(KEY, f"`{target}` names no database file", _FIX)
        return "sqlite", path
    if scheme not in _POSTGRES_SCHEMES:
        raise ConfigError(KEY, f"`{scheme}://` is not a store Parley knows", _FIX)
    url = f"postgresql://{rest}"  # libpq reads no `+driver`
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.password is not None or "password" in query:
        raise ConfigError(
            KEY,
            "the URL holds a password, and secrets never live in the config",
            "remove it from the URL; name the environment variable that holds it in "
            "`store.password_env`",
        )
    # libpq would fill a missing host or database from its environment and defaults (the
    # local socket, a database named after the user), and Parley would migrate whatever
    # that picked: both must be said.
    missing = [
        what
        for what, given in (
            ("host", parts.hostname or query.get("host")),
            ("database name", parts.path.strip("/") or query.get("dbname")),
        )
        if not given
    ]
    if missing:
        raise ConfigError(KEY, f"`{target}` names no {' and no '.join(missing)}", _POSTGRES_FIX)
    return "postgresql", url
