"""The tables the cross-node primitives share, and their recorded migrations.

The same scheme as ``sessions.pg.schema``, through the same runner
(``sessions.apply_migrations_async``): named migrations recorded in
``recalld_cluster_migrations``, all pending ones applied in one transaction holding
``pg_advisory_xact_lock(MIGRATION_LOCK)``, so nodes starting together do not race.
"""

from __future__ import annotations

import psycopg

from sessions import apply_migrations_async, async_pg_ledger

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "connect", "migrate"]

# "recldclu" as a big-endian int64: this package's own constant, apart from sessions' and memory's.
MIGRATION_LOCK = int.from_bytes(b"recldclu", "big")

_M001 = """
CREATE TABLE recalld_events (
    id         bigserial PRIMARY KEY,
    node       text NOT NULL,
    payload    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX recalld_events_created ON recalld_events (created_at);
CREATE TABLE recalld_idempotency (
    user_id     text NOT NULL,
    session_key text NOT NULL,
    key         text NOT NULL,
    run_id      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (user_id, session_key, key)
);
CREATE INDEX recalld_idempotency_expires ON recalld_idempotency (expires_at);
"""

# Run leases (gateway.cluster.leases): one row per session being run, its holder and a fencing
# token from one sequence, so a token is never handed out twice even after a row is deleted;
# `partial` is the holder's checkpoint of the reply streamed so far. `recalld_runs` lists the
# runs appended but not finished, each renewed by its node: a run whose row expired is dead.
_M002 = """
CREATE SEQUENCE recalld_lease_tokens;
CREATE TABLE recalld_run_leases (
    session_key text PRIMARY KEY,
    user_id     text NOT NULL,
    run_id      text NOT NULL,
    node        text NOT NULL,
    token       bigint NOT NULL,
    expires_at  timestamptz NOT NULL,
    partial     text NOT NULL DEFAULT ''
);
CREATE INDEX recalld_run_leases_expires ON recalld_run_leases (expires_at);
CREATE TABLE recalld_runs (
    run_id      text PRIMARY KEY,
    session_key text NOT NULL,
    user_id     text NOT NULL,
    node        text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX recalld_runs_session ON recalld_runs (session_key);
CREATE INDEX recalld_runs_node ON recalld_runs (node);
CREATE INDEX recalld_runs_expires ON recalld_runs (expires_at);
"""

#: ``(name, sql)`` in the order they apply; an applied one is never edited.
MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("m001_events_and_idempotency", _M001),
    ("m002_run_leases", _M002),
)


async def migrate(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> list[str]:
    """Apply the pending migrations under the advisory lock; returns the names applied now."""
    async with async_pg_ledger(conn, table="recalld_cluster_migrations",
                               lock=MIGRATION_LOCK) as ledger:
        return await apply_migrations_async(ledger, MIGRATIONS)


async def connect(dsn: str, *, connect_timeout_s: float, application_name: str,
                  ) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """An autocommit connection that the server drops within about 25 s of the node
    vanishing (server-side TCP keepalives), so locks and listens of a dead node go with it."""
    conn = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout_s)),
        application_name=application_name,
    )
    await conn.execute(
        "SELECT set_config('tcp_keepalives_idle', '10', false),"
        " set_config('tcp_keepalives_interval', '5', false),"
        " set_config('tcp_keepalives_count', '3', false)"
    )
    return conn
