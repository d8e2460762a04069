"""The few spellings in which the store's SQL differs between SQLite and PostgreSQL.

Shared statements are written once, with `?` placeholders, and spelt for a backend by
its `Dialect` when the module that holds them is imported (never per call). No ORM: a
statement stays the text the database runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from core.records import record


@record(frozen=True)
class Dialect:
    """One backend's spellings.

    Attributes:
        name: "sqlite" or "postgres".
        param: a placeholder (`?` or `%s`).
        text_param: a placeholder whose value may be NULL compared with NULL (PostgreSQL
            must be told its type).
        is_: `IS` as a comparison that treats two NULLs as equal.
        like: a case-insensitive `LIKE` for ASCII letters (SQLite's `LIKE` already is).
        now: the time a statement takes effect, in seconds since the epoch. On SQLite it
            is a parameter (`clock()` gives it, computed when the write lock is held); on
            PostgreSQL the server's clock, as the workers' heartbeats are.
    """

    name: str
    param: str
    text_param: str
    is_: str
    like: str
    now: str

    def sql(self, text: str) -> str:
        """`text`, written with `?` placeholders, in this dialect (`?` is never used in the
        store's SQL otherwise)."""
        return text.replace("?", self.param) if self.param != "?" else text

    def clock(self) -> tuple[float, ...]:
        """The parameters of `now`: the current time on SQLite, none on PostgreSQL."""
        return (time.time(),) if self.now == "?" else ()

    def upsert(
        self, table: str, columns: str, key: str, *, reset: str = "", where: str = ""
    ) -> str:
        """Insert a row, or replace the row with the same `key`: SQLite's `INSERT OR
        REPLACE`, and on PostgreSQL an `ON CONFLICT` update that also gives the `reset`
        columns their defaults (a replaced SQLite row loses what the new one does not
        give). With `where` (a condition whose parameters follow the columns', written in
        this dialect), nothing is written unless it holds."""
        names = [c.strip() for c in columns.split(",")]
        values = ", ".join([self.param] * len(names))
        rows = f"SELECT {values} WHERE {where}" if where else f"VALUES ({values})"
        if self.name == "sqlite":
            return f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) {rows}"
        keys = {k.strip() for k in key.split(",")}
        sets = [f"{c} = EXCLUDED.{c}" for c in names if c not in keys]
        sets += [f"{c.strip()} = DEFAULT" for c in reset.split(",") if c.strip()]
        return (
            f"INSERT INTO {table} ({', '.join(names)}) {rows} "
            f"ON CONFLICT ({key}) DO UPDATE SET {', '.join(sets)}"
        )

    def sequence(self, column: str, table: str) -> tuple[str, str]:
        """What an insert into `table` adds to its column list and its values for the
        table's next `column` number: SQLite takes the largest plus one (under its write
        lock, so in order); PostgreSQL's column is an identity the insert leaves out."""
        if self.name == "sqlite":
            return f", {column}", f", (SELECT IFNULL(MAX({column}), 0) + 1 FROM {table})"
        return "", ""

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """`column` is one of `values` (not empty): the condition and its parameters."""
        if self.name == "sqlite":
            return f"{column} IN ({', '.join('?' * len(values))})", list(values)
        return f"{column} = ANY(%s)", [list(values)]


SQLITE = Dialect(name="sqlite", param="?", text_param="?", is_="IS", like="LIKE", now="?")
POSTGRES = Dialect(
    name="postgres",
    param="%s",
    text_param="%s::text",
    is_="IS NOT DISTINCT FROM",
    like="ILIKE",
    now="extract(epoch FROM clock_timestamp())::double precision",
)
