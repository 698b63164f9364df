"""The PostgreSQL memory schema: migrations recorded once, safe when nodes start together."""

from __future__ import annotations

import threading

import psycopg

from memory.pg.migrations import MIGRATIONS, migrate


def test_migrate_applies_each_migration_once(pg_dsn: str) -> None:
    """A second start finds every migration recorded and applies nothing."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert migrate(conn) == [name for name, _ in MIGRATIONS]
        assert migrate(conn) == []


def test_nodes_migrating_an_empty_database_together_all_succeed(pg_dsn: str) -> None:
    """Six nodes migrating one empty database at the same moment all start; the advisory lock
    lets exactly one apply each migration."""
    applied: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def node() -> None:
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                barrier.wait()
                applied.append(migrate(conn))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=node) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert (sorted(name for names in applied for name in names)
            == sorted(name for name, _ in MIGRATIONS))
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT name, count(*) FROM recalld_memory_migrations GROUP BY name").fetchall()
    assert dict(rows) == {name: 1 for name, _ in MIGRATIONS}
