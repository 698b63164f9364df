"""Ordered, named, recorded schema migrations: the one runner every database of recalld uses.

A schema module gives an ordered list of ``(name, step)`` pairs (``m001_…``: never edit an
applied one, add the next) and opens a ledger over its connection: the adapter that knows that
database's migrations table. :func:`apply_migrations` (:func:`apply_migrations_async` for an
async connection) applies, in order, every step whose name the ledger has not recorded, and
returns the names applied now, as sqlite-utils' ``sqlite-migrate`` does.

* :func:`sqlite_ledger` — apsw; a step is a function of the connection, run in its own
  transaction together with its record row, so a failing step leaves the earlier ones applied
  and itself unrecorded. ``applied_at`` is an ISO-8601 UTC text.
* :func:`pg_ledger`, :func:`async_pg_ledger` — psycopg; a step is SQL. The whole run is ONE
  transaction that first takes ``pg_advisory_xact_lock(lock)``: nodes starting together on an
  empty database queue on the lock, the first applies what is missing and each later one finds
  it recorded; a failing step rolls the whole run back. ``applied_at`` is a ``timestamptz``.

The table names are the schema modules' constants, never user input; they keep the names and
row formats the loops before this module wrote, so existing databases open unchanged.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import SchemaTooNew

if TYPE_CHECKING:
    import apsw
    import psycopg

__all__ = [
    "AsyncLedger",
    "AsyncPgLedger",
    "Ledger",
    "PgLedger",
    "SqliteLedger",
    "apply_migrations",
    "apply_migrations_async",
    "async_pg_ledger",
    "pg_ledger",
    "sqlite_ledger",
]

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class Ledger(Protocol[S_contra]):
    """A database's record of applied migrations, and the way one more is applied there."""

    @property
    def table(self) -> str:
        """The ledger's table (named in errors)."""
        ...

    def applied(self) -> set[str]: ...

    def apply(self, name: str, step: S_contra) -> None:
        """Run ``step`` and record ``name``; neither happens without the other."""
        ...


class AsyncLedger(Protocol[S_contra]):
    """:class:`Ledger` over an async connection."""

    @property
    def table(self) -> str: ...

    async def applied(self) -> set[str]: ...

    async def apply(self, name: str, step: S_contra) -> None: ...


def _pending(migrations: Sequence[tuple[str, S]], done: set[str],
             table: str) -> list[tuple[str, S]]:
    """The steps not yet recorded; SchemaTooNew when the ledger records a migration this
    version does not know, numbered as its newest or above (a newer recalld's, or another
    branch's). An unknown name numbered below it is let be: nothing this version reads
    depends on it."""
    if migrations:
        newest = migrations[-1][0]
        known = {name for name, _ in migrations}
        newer = sorted(n for n in done if n not in known and _number(n) >= _number(newest))
        if newer:
            raise SchemaTooNew(
                f"the database was migrated by a newer recalld ({', '.join(newer)} in {table}); "
                f"this version knows migrations up to {newest}: upgrade this node")
    return [(name, step) for name, step in migrations if name not in done]


def _number(name: str) -> int:
    found = re.match(r"m(\d+)_", name)
    return int(found.group(1)) if found else 0


def apply_migrations(ledger: Ledger[S], migrations: Sequence[tuple[str, S]]) -> list[str]:
    """Apply, in order, every migration the ledger has not recorded; returns the names applied
    now."""
    applied_now: list[str] = []
    for name, step in _pending(migrations, ledger.applied(), ledger.table):
        ledger.apply(name, step)
        applied_now.append(name)
    return applied_now


async def apply_migrations_async(ledger: AsyncLedger[S],
                                 migrations: Sequence[tuple[str, S]]) -> list[str]:
    """:func:`apply_migrations` over an :class:`AsyncLedger`."""
    applied_now: list[str] = []
    for name, step in _pending(migrations, await ledger.applied(), ledger.table):
        await ledger.apply(name, step)
        applied_now.append(name)
    return applied_now


def _table(name: str) -> str:
    # Formatted into SQL (an identifier cannot be a parameter): only a plain name passes.
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"not a migrations table name: {name!r}")
    return name


class SqliteLedger:
    """The ledger of an apsw database:
    ``<table>(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)``."""

    def __init__(self, db: apsw.Connection, table: str) -> None:
        self._db = db
        self._table = _table(table)

    @property
    def table(self) -> str:
        return self._table

    def applied(self) -> set[str]:
        return {str(row[0]) for row in self._db.execute(f"SELECT name FROM {self._table}")}

    def apply(self, name: str, step: Callable[[apsw.Connection], None]) -> None:
        with self._db:
            step(self._db)
            self._db.execute(
                f"INSERT INTO {self._table}(name, applied_at) VALUES (?, ?)",
                (name, datetime.now(UTC).isoformat()),
            )


def sqlite_ledger(db: apsw.Connection, table: str = "migrations") -> SqliteLedger:
    """Create the migrations table if it is missing; the ledger over it."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {_table(table)}(name TEXT PRIMARY KEY, "
               "applied_at TEXT NOT NULL)")
    return SqliteLedger(db, table)


_PG_TABLE = ("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, "
             "applied_at timestamptz NOT NULL DEFAULT now())")


class PgLedger:
    """The ledger of a PostgreSQL database, inside the transaction :func:`pg_ledger` holds."""

    def __init__(self, conn: psycopg.Connection[Any], table: str) -> None:
        self._conn = conn
        self._table = _table(table)

    @property
    def table(self) -> str:
        return self._table

    def applied(self) -> set[str]:
        return {str(row[0])
                for row in self._conn.execute(f"SELECT name FROM {self._table}").fetchall()}

    def apply(self, name: str, step: str) -> None:
        self._conn.execute(step)
        self._conn.execute(f"INSERT INTO {self._table} (name) VALUES (%s)", (name,))


@contextmanager
def pg_ledger(conn: psycopg.Connection[Any], *, table: str, lock: int,
              prelude: Sequence[str] = ()) -> Iterator[PgLedger]:
    """One transaction holding ``pg_advisory_xact_lock(lock)``: run ``prelude`` (statements that
    must come before the table, under the lock), create the migrations table if it is missing,
    and yield the ledger over it; the transaction commits when the block ends."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        for sql in prelude:
            conn.execute(sql)
        conn.execute(_PG_TABLE.format(_table(table)))
        yield PgLedger(conn, table)


class AsyncPgLedger:
    """:class:`PgLedger` over a psycopg ``AsyncConnection``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], table: str) -> None:
        self._conn = conn
        self._table = _table(table)

    @property
    def table(self) -> str:
        return self._table

    async def applied(self) -> set[str]:
        cur = await self._conn.execute(f"SELECT name FROM {self._table}")
        return {str(row[0]) for row in await cur.fetchall()}

    async def apply(self, name: str, step: str) -> None:
        await self._conn.execute(step)
        await self._conn.execute(f"INSERT INTO {self._table} (name) VALUES (%s)", (name,))


@asynccontextmanager
async def async_pg_ledger(conn: psycopg.AsyncConnection[Any], *, table: str, lock: int,
                          prelude: Sequence[str] = ()) -> AsyncIterator[AsyncPgLedger]:
    """:func:`pg_ledger` over a psycopg ``AsyncConnection``."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        for sql in prelude:
            await conn.execute(sql)
        await conn.execute(_PG_TABLE.format(_table(table)))
        yield AsyncPgLedger(conn, table)
