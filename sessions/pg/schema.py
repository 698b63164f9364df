"""The PostgreSQL schema of the sessions store and its recorded migrations.

Migrations are ordered and named (``m001_…``); an applied one is never edited, the next is
added. :func:`migrate` runs every pending one (through :mod:`sessions.migrations`) in ONE
transaction that first takes ``pg_advisory_xact_lock(MIGRATION_LOCK)``: nodes starting together
on an empty database queue on the lock, and each later one finds the work recorded in
``recalld_sessions_migrations``.

The two tables are a contract with the memory indexer, which reads them (docs/sessions.md,
"PostgreSQL"): columns may be added, never renamed or dropped. Keys and timestamps are
``COLLATE "C"`` so that they sort byte by byte, as the fixed-width timestamp format and the
list cursor expect, whatever the database's default collation is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sessions.migrations import apply_migrations, pg_ledger

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "migrate"]

# One constant per package ("recldses" as a big-endian int64); the memory package has its own.
MIGRATION_LOCK = int.from_bytes(b"recldses", "big")

_M001 = """
CREATE TABLE recalld_sessions (
    session_key   text COLLATE "C" PRIMARY KEY,
    user_id       text NOT NULL,
    title         text NOT NULL,
    system_prompt text,
    model         text,
    memory        boolean NOT NULL DEFAULT true,
    created_at    text COLLATE "C" NOT NULL,
    updated_at    text COLLATE "C" NOT NULL,
    message_count integer NOT NULL DEFAULT 0,
    bytes         bigint NOT NULL DEFAULT 0,
    next_seq      bigint NOT NULL DEFAULT 0
);
CREATE INDEX recalld_sessions_newest
    ON recalld_sessions (user_id, updated_at DESC, session_key DESC);
CREATE TABLE recalld_messages (
    session_key text COLLATE "C" NOT NULL REFERENCES recalld_sessions ON DELETE CASCADE,
    seq         bigint NOT NULL,
    id          text NOT NULL,
    role        text NOT NULL,
    content     text NOT NULL,
    ts          text NOT NULL,
    run_id      text,
    name        text,
    extra       jsonb NOT NULL DEFAULT '{}',
    line_bytes  integer NOT NULL,
    PRIMARY KEY (session_key, seq)
);
"""

# A session's conversation summary (docs/sessions.md, "Conversation summaries"): one row, the
# newest; ``through_seq`` is the seq of the last message it covers, for purges.
_M002 = """
CREATE TABLE recalld_summaries (
    session_key text COLLATE "C" PRIMARY KEY REFERENCES recalld_sessions ON DELETE CASCADE,
    id          text NOT NULL,
    content     text NOT NULL,
    ts          text NOT NULL,
    through     text NOT NULL,
    through_seq bigint NOT NULL,
    messages    integer NOT NULL
);
"""

# A session's sampling (sessions.update {temperature, maxTokens}); NULL: the endpoint's default.
_M003 = """
ALTER TABLE recalld_sessions ADD COLUMN temperature double precision, ADD COLUMN max_tokens integer;
"""

# chat.send's files (docs/protocol.md, "Attachments"), content-addressed per session and
# deleted with it by the cascade (sessions.delete, retention); the message rows carry only
# their metadata (``extra.attachments``).
_M004 = """
CREATE TABLE recalld_attachments (
    session_key text COLLATE "C" NOT NULL REFERENCES recalld_sessions ON DELETE CASCADE,
    sha256      text COLLATE "C" NOT NULL,
    bytes       bigint NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (session_key, sha256)
);
"""

#: ``(name, sql)`` in the order they apply.
MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("m001_sessions_and_messages", _M001),
    ("m002_conversation_summaries", _M002),
    ("m003_session_sampling", _M003),
    ("m004_attachments", _M004),
)


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """Apply the pending migrations under the advisory lock; returns the names applied now."""
    with pg_ledger(conn, table="recalld_sessions_migrations", lock=MIGRATION_LOCK) as ledger:
        return apply_migrations(ledger, MIGRATIONS)
