"""Ordered, named, recorded schema migrations (``m001_…``); never edit an applied one.

Each migration is a function taking the connection; :func:`migrate` runs the ones not yet
recorded in ``migrations``, each in its own transaction together with its record row (the
runner is ``sessions.apply_migrations``, shared with the PostgreSQL schemas).

The vector table ``chunks_vec`` is not created here: its width is the embedder's dimension
count, which is known only at run time, so the writer creates (and re-creates on an embedder
change) it — see ``memory.sqlite.index.vectors.ensure_vector_table``.
"""

from __future__ import annotations

from collections.abc import Callable

import apsw

from memory.quantize import cached_vector_to_int8
from sessions import apply_migrations, sqlite_ledger

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]


def m001_initial(db: apsw.Connection) -> None:
    db.execute(
        """
        CREATE TABLE meta(
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );

        -- One row per transcript: how far it is indexed and a fingerprint of that prefix.
        CREATE TABLE files(
            path            TEXT PRIMARY KEY,      -- relative to <data_dir>/sessions
            user            TEXT NOT NULL,
            session_key     TEXT NOT NULL,
            size            INTEGER NOT NULL,      -- file size seen at the last sync
            mtime_ns        INTEGER NOT NULL,      -- and its mtime: (size, mtime) unchanged → skip
            hash            TEXT NOT NULL,         -- sha256 of the indexed prefix's head + tail
            indexed_offset  INTEGER NOT NULL,      -- bytes of complete lines consumed
            indexed_lines   INTEGER NOT NULL,      -- lines consumed (1-based numbering)
            chunking        TEXT NOT NULL,         -- chunk settings the rows were built with
            indexed_at      TEXT NOT NULL
        );

        CREATE TABLE chunks(
            id            INTEGER PRIMARY KEY,
            path          TEXT NOT NULL,
            user          TEXT NOT NULL,
            session_key   TEXT NOT NULL,
            chunk_idx     INTEGER NOT NULL,
            content       TEXT NOT NULL,
            line_start    INTEGER NOT NULL,
            line_end      INTEGER NOT NULL,
            seg_start     INTEGER NOT NULL,        -- first segment of line_start's message
            byte_start    INTEGER NOT NULL,        -- file offset of line_start
            start_ts      TEXT,
            end_ts        TEXT,
            start_ms      INTEGER,
            end_ms        INTEGER,
            content_hash  TEXT NOT NULL,           -- sha256 of content
            embedded      INTEGER NOT NULL DEFAULT 0,
            UNIQUE(path, chunk_idx)
        );
        CREATE INDEX chunks_user_session ON chunks(user, session_key);
        CREATE INDEX chunks_pending ON chunks(id) WHERE embedded = 0;

        -- Contentless: the indexed text is the chunk with CJK characters spaced apart
        -- (memory.chunking.fts_text); the display text lives once, in chunks.content.
        CREATE VIRTUAL TABLE chunks_fts USING fts5(
            body,
            content = '',
            contentless_delete = 1,
            tokenize = 'porter unicode61 remove_diacritics 2'
        );

        -- Each distinct text sent to an embedder, embedded once per embedder identity.
        CREATE TABLE embedding_cache(
            provider       TEXT NOT NULL,
            model          TEXT NOT NULL,
            endpoint_hash  TEXT NOT NULL,
            content_hash   TEXT NOT NULL,          -- sha256 of the exact text sent
            dims           INTEGER NOT NULL,
            vector         BLOB NOT NULL,          -- float32 little-endian
            created_at     TEXT NOT NULL,
            PRIMARY KEY (provider, model, endpoint_hash, content_hash)
        ) WITHOUT ROWID;
        """
    )


def m002_quantized_vectors(db: apsw.Connection) -> None:
    """The cache keeps int8 vectors (¼ of float32); ``chunks_vec`` keeps sign bits and points
    at the cache through ``chunks.vector_hash`` for the exact re-rank (docs/memory.md).

    Existing float32 cache rows are converted in place; existing vectors are marked stale, so
    the next start with sqlite-vec rebuilds ``chunks_vec`` from the cache, calling no embedder.
    """
    # The cache key (sha256 of the text sent to the embedder) of the chunk's vector, when it
    # is not content_hash (the text sent was redacted); NULL otherwise.
    db.execute("ALTER TABLE chunks ADD COLUMN vector_hash TEXT")
    rows = list(db.execute(
        "SELECT provider, model, endpoint_hash, content_hash, dims, vector FROM embedding_cache "
        "WHERE length(vector) = 4 * dims"))
    for provider, model, endpoint, content_hash, dims, blob in rows:
        db.execute(
            "UPDATE embedding_cache SET vector = ? WHERE provider = ? AND model = ? "
            "AND endpoint_hash = ? AND content_hash = ?",
            (cached_vector_to_int8(bytes(blob), int(dims)), provider, model, endpoint,
             content_hash),
        )
    if db.execute("SELECT 1 FROM chunks WHERE embedded = 1 LIMIT 1").fetchone() is not None:
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('vectors_stale', '1')")


def m003_facts(db: apsw.Connection) -> None:
    """Remembered facts (memory.facts): one row per version of a fact. A change never edits a
    row: it writes the next version (``previous_id``) and marks the old one inactive, so the
    history stays; every version of one fact shares ``origin_id``, which is what deleting a
    fact removes. Facts are not rebuilt from transcripts, so a full reindex leaves them alone."""
    db.execute(
        """
        CREATE TABLE facts(
            id           INTEGER PRIMARY KEY,
            user         TEXT NOT NULL,
            text         TEXT NOT NULL,
            text_hash    TEXT NOT NULL,            -- sha256 of the normalised text (exact dedup)
            active       INTEGER NOT NULL DEFAULT 1,
            previous_id  INTEGER,                  -- the version this one replaced
            origin_id    INTEGER,                  -- the first version (NULL: this row)
            source       TEXT NOT NULL,            -- 'model' (remember tool) or 'user' (RPC)
            session_key  TEXT,                     -- where it was said, for memory.forget
            run_id       TEXT,
            created_at   TEXT NOT NULL,
            updated_at   TEXT NOT NULL,
            said_ms      INTEGER NOT NULL,         -- when last said (a repeat refreshes it): retention, forget
            vector       BLOB,                     -- float32 little-endian, for semantic dedup
            vector_model TEXT                      -- the embedder identity of that vector
        );
        CREATE UNIQUE INDEX facts_active_hash ON facts(user, text_hash) WHERE active = 1;
        CREATE INDEX facts_user ON facts(user, active, id);
        CREATE INDEX facts_origin ON facts(origin_id);
        """  # noqa: E501  (an applied migration's SQL is never edited, long lines included)
    )


def m004_forgotten(db: apsw.Connection) -> None:
    """What ``memory.forget`` removed without purging the transcript: the indexer drops chunks
    matching a row here whenever it writes, so a sync or a full reindex cannot bring them back."""
    db.execute(
        """
        CREATE TABLE forgotten(
            id           INTEGER PRIMARY KEY,
            user         TEXT NOT NULL,
            session_key  TEXT,                     -- NULL: every session of the user
            after_ms     INTEGER,                  -- NULL: no lower bound
            before_ms    INTEGER,                  -- NULL: no upper bound
            created_at   TEXT NOT NULL
        );
        CREATE INDEX forgotten_user ON forgotten(user);
        CREATE INDEX chunks_end_ms ON chunks(end_ms);
        """
    )


def m005_episodes(db: apsw.Connection) -> None:
    """Episodes (1–2 sentence summaries of what a conversation discussed, decided or did) and
    the durable queue of summaries still to write, so a failed one is retried, never lost."""
    db.execute(
        """
        CREATE TABLE episodes(
            id           INTEGER PRIMARY KEY,
            user         TEXT NOT NULL,
            session_key  TEXT NOT NULL,
            text         TEXT NOT NULL,
            theme        TEXT NOT NULL,
            day          TEXT NOT NULL,            -- ISO date in the user's time zone
            week         TEXT NOT NULL,            -- ISO week, e.g. 2026-W47
            year         INTEGER NOT NULL,
            created_ms   INTEGER NOT NULL,
            updated_ms   INTEGER NOT NULL,         -- a merge moves it
            covered_ms   INTEGER NOT NULL,         -- the newest message it summarises
            merges       INTEGER NOT NULL DEFAULT 0,
            vector       BLOB,
            vector_model TEXT
        );
        CREATE INDEX episodes_user ON episodes(user, updated_ms);
        CREATE INDEX episodes_session ON episodes(user, session_key, covered_ms);

        CREATE TABLE episode_jobs(
            id           INTEGER PRIMARY KEY,
            user         TEXT NOT NULL,
            session_key  TEXT NOT NULL,
            created_ms   INTEGER NOT NULL,
            attempts     INTEGER NOT NULL DEFAULT 0,
            next_ms      INTEGER NOT NULL,         -- when it may be tried (again)
            last_error   TEXT,
            failed       INTEGER NOT NULL DEFAULT 0,   -- gave up after the last attempt allowed
            UNIQUE(user, session_key)
        );
        """
    )


def m006_compact_cache(db: apsw.Connection) -> None:
    """A cache row keeps only what serves (docs/memory.md, "Embedding cache"): its key, the
    width and the int8 vector. ``created_at`` (32 bytes of ISO text a row, never read) goes.

    ``DROP COLUMN`` rewrites each row where it stands, so the file does not grow by a copy of
    the table; the space freed inside the pages takes later rows. A float32 row still present
    (copied in from a cache written before ``m002``) is converted to int8. The vectors do not
    change, so ``chunks_vec`` stays as it is.
    """
    db.execute("ALTER TABLE embedding_cache DROP COLUMN created_at")
    rows = list(db.execute(
        "SELECT provider, model, endpoint_hash, content_hash, dims, vector FROM embedding_cache "
        "WHERE length(vector) = 4 * dims"))
    for provider, model, endpoint, content_hash, dims, blob in rows:
        db.execute(
            "UPDATE embedding_cache SET vector = ? WHERE provider = ? AND model = ? "
            "AND endpoint_hash = ? AND content_hash = ?",
            (cached_vector_to_int8(bytes(blob), int(dims)), provider, model, endpoint,
             content_hash),
        )


def m007_fact_ids_never_reused(db: apsw.Connection) -> None:
    """A fact's id is never given again: an agent holding a deleted fact's id must not reach
    (and forget) the next fact saved. A plain ``INTEGER PRIMARY KEY`` hands out ``max(id) + 1``,
    so deleting the newest fact freed its id; ``AUTOINCREMENT`` keeps the highest id ever given
    in ``sqlite_sequence``. SQLite cannot add it to a table, so ``facts`` is rebuilt with the
    same columns, rows and indexes (an id deleted before this migration is past knowing)."""
    db.execute(
        """
        CREATE TABLE facts_new(
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            user         TEXT NOT NULL,
            text         TEXT NOT NULL,
            text_hash    TEXT NOT NULL,
            active       INTEGER NOT NULL DEFAULT 1,
            previous_id  INTEGER,
            origin_id    INTEGER,
            source       TEXT NOT NULL,
            session_key  TEXT,
            run_id       TEXT,
            created_at   TEXT NOT NULL,
            updated_at   TEXT NOT NULL,
            said_ms      INTEGER NOT NULL,
            vector       BLOB,
            vector_model TEXT
        );
        INSERT INTO facts_new(id, user, text, text_hash, active, previous_id, origin_id, source, session_key,
                              run_id, created_at, updated_at, said_ms, vector, vector_model)
            SELECT id, user, text, text_hash, active, previous_id, origin_id, source, session_key,
                   run_id, created_at, updated_at, said_ms, vector, vector_model FROM facts;
        DROP TABLE facts;
        ALTER TABLE facts_new RENAME TO facts;
        CREATE UNIQUE INDEX facts_active_hash ON facts(user, text_hash) WHERE active = 1;
        CREATE INDEX facts_user ON facts(user, active, id);
        CREATE INDEX facts_origin ON facts(origin_id);
        """  # noqa: E501  (an applied migration's SQL is never edited, long lines included)
    )


def m008_fact_client(db: apsw.Connection) -> None:
    # The client token a fact was saved through (`recalld token add NAME`); NULL: the user's own.
    db.execute("ALTER TABLE facts ADD COLUMN client TEXT")


MIGRATIONS: list[tuple[str, Callable[[apsw.Connection], None]]] = [
    ("m001_initial", m001_initial),
    ("m002_quantized_vectors", m002_quantized_vectors),
    ("m003_facts", m003_facts),
    ("m004_forgotten", m004_forgotten),
    ("m005_episodes", m005_episodes),
    ("m006_compact_cache", m006_compact_cache),
    ("m007_fact_ids_never_reused", m007_fact_ids_never_reused),
    ("m008_fact_client", m008_fact_client),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: apsw.Connection) -> list[str]:
    """Apply every migration not yet recorded; returns the names applied now."""
    return apply_migrations(sqlite_ledger(db, "migrations"), MIGRATIONS)
