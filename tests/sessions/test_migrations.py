"""The one migration runner (``sessions.migrations``): steps apply in their order, once, and a
failing step is rolled back and not recorded, on SQLite (apsw) and on PostgreSQL (psycopg)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw
import psycopg
import pytest

from sessions import (
    SchemaTooNew,
    apply_migrations,
    apply_migrations_async,
    async_pg_ledger,
    pg_ledger,
    sqlite_ledger,
)

SqliteStep = Callable[[apsw.Connection], None]


def _sql(statement: str) -> SqliteStep:
    return lambda db: db.execute(statement)  # type: ignore[return-value]


def _fail(db: apsw.Connection) -> None:
    db.execute("CREATE TABLE half_done(x)")
    raise RuntimeError("step failed")


def test_sqlite_applies_in_order_once_and_rolls_back_a_failing_step(tmp_path: Path) -> None:
    """Steps run in list order and are recorded with a time; a second run applies nothing; a
    failing step leaves the ones before it applied and itself neither applied nor recorded, so
    the next run (with the step fixed) applies exactly it."""
    db = apsw.Connection(str(tmp_path / "m.db"))
    order: list[str] = []
    first: list[tuple[str, SqliteStep]] = [
        ("m001_a", lambda db: order.append("a")),
        ("m002_b", _sql("CREATE TABLE b(x)")),
    ]
    assert apply_migrations(sqlite_ledger(db, "ledger"), first) == ["m001_a", "m002_b"]
    assert order == ["a"]
    assert apply_migrations(sqlite_ledger(db, "ledger"), first) == []
    assert order == ["a"]

    with pytest.raises(RuntimeError, match="step failed"):
        apply_migrations(sqlite_ledger(db, "ledger"),
                         [*first, ("m003_c", _sql("CREATE TABLE c(x)")), ("m004_d", _fail)])
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {"b", "c"} <= tables and "half_done" not in tables
    rows = db.execute("SELECT name, applied_at FROM ledger ORDER BY name").fetchall()
    assert [name for name, _ in rows] == ["m001_a", "m002_b", "m003_c"]
    assert all(str(at).endswith("+00:00") for _, at in rows)
    fixed = [*first, ("m003_c", _fail), ("m004_d", _sql("CREATE TABLE d(x)"))]
    assert apply_migrations(sqlite_ledger(db, "ledger"), fixed) == ["m004_d"]


def test_postgres_applies_in_order_once_and_a_failing_step_rolls_back_its_run(pg_dsn: str) -> None:
    """Steps run in list order under the lock; a second run applies nothing; a failing step
    rolls back every step of its run (one transaction), so none of them is recorded."""
    steps = [("m001_a", "CREATE TABLE t_a (x int)"),
             ("m002_b", "INSERT INTO t_a VALUES (1); INSERT INTO t_a VALUES (2)")]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pg_ledger(conn, table="test_migrations", lock=42) as ledger:
            assert apply_migrations(ledger, steps) == ["m001_a", "m002_b"]
        with pg_ledger(conn, table="test_migrations", lock=42) as ledger:
            assert apply_migrations(ledger, steps) == []
        with pytest.raises(psycopg.errors.UndefinedTable), \
                pg_ledger(conn, table="test_migrations", lock=42) as ledger:
            apply_migrations(ledger, [*steps, ("m003_c", "CREATE TABLE t_c (x int)"),
                                      ("m004_d", "INSERT INTO no_such_table VALUES (1)")])
        assert conn.execute("SELECT to_regclass('t_c')").fetchone() == (None,)
        assert conn.execute("SELECT x FROM t_a ORDER BY x").fetchall() == [(1,), (2,)]
        names = conn.execute("SELECT name FROM test_migrations ORDER BY name").fetchall()
        assert names == [("m001_a",), ("m002_b",)]


async def test_postgres_async_ledger_records_like_the_sync_one(pg_dsn: str) -> None:
    """The async runner applies what is pending once and records it in the same table format."""
    steps = [("m001_a", "CREATE TABLE t_a (x int)")]
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        for expected in (["m001_a"], []):
            async with async_pg_ledger(conn, table="test_migrations", lock=42) as ledger:
                assert await apply_migrations_async(ledger, steps) == expected
        cur = await conn.execute("SELECT name, applied_at IS NOT NULL FROM test_migrations")
        assert await cur.fetchall() == [("m001_a", True)]


def test_a_migration_newer_than_this_versions_is_refused_with_its_name(tmp_path: Path) -> None:
    """A ledger that records a migration numbered above this version's newest (a newer recalld
    migrated the database) is refused before any step runs, naming it and the table; an unknown
    name numbered below the newest is let be."""
    db = apsw.Connection(str(tmp_path / "m.db"))
    steps: list[tuple[str, SqliteStep]] = [("m001_a", _sql("CREATE TABLE a(x)")),
                                           ("m002_b", _sql("CREATE TABLE b(x)"))]
    apply_migrations(sqlite_ledger(db, "ledger"), steps[:1])
    db.execute("INSERT INTO ledger VALUES ('m000_retired', '2026-01-01T00:00:00+00:00')")
    assert apply_migrations(sqlite_ledger(db, "ledger"), steps[:1]) == []
    db.execute("INSERT INTO ledger VALUES ('m003_newer', '2030-01-01T00:00:00+00:00')")
    with pytest.raises(SchemaTooNew, match=r"newer recalld \(m003_newer in ledger\).* m002_b"):
        apply_migrations(sqlite_ledger(db, "ledger"), steps)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert "a" in tables and "b" not in tables


def test_postgres_refuses_a_newer_migration_under_its_lock(pg_dsn: str) -> None:
    """The same refusal on PostgreSQL: nothing of the run is applied or recorded."""
    steps = [("m001_a", "CREATE TABLE t_a (x int)"), ("m002_b", "CREATE TABLE t_b (x int)")]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pg_ledger(conn, table="test_newer", lock=43) as ledger:
            apply_migrations(ledger, steps[:1])
        conn.execute("INSERT INTO test_newer (name, applied_at) VALUES ('m007_newer', now())")
        with pytest.raises(SchemaTooNew, match="m007_newer in test_newer"), \
                pg_ledger(conn, table="test_newer", lock=43) as ledger:
            apply_migrations(ledger, steps)
        assert conn.execute("SELECT to_regclass('t_b')").fetchone() == (None,)
