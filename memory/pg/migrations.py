"""The memory index's PostgreSQL schema: ordered, named migrations, recorded and run once.

Every start calls :func:`migrate`. It runs in one transaction that first takes
``pg_advisory_xact_lock(MIGRATION_LOCK)``, so nodes starting together on an empty database
queue behind each other: the first applies what is missing, the others find every migration
recorded in ``recalld_memory_migrations`` and apply nothing. Never edit an applied migration;
add the next one.

Tables (prefix ``recalld_memory_``; the sessions package owns its own tables, which the
indexer reads only through :mod:`sessions.pg.feed`):

* ``chunks`` — one row per chunk, as :mod:`memory.chunking` makes it; ``tsv`` (its
  lexemes and positions), ``doc_len`` (tokens, for BM25), ``embedding`` (the int8-quantized
  vector as a ``halfvec``: cosine over it equals SQLite's int8 cosine; NULL while pending),
  ``embedding_previous`` (m007: the previous model's vector while an embedder change is rebuilt).
  The vector index is created by :mod:`memory.pg.vectors` once the embedder's width is known.
* ``postings`` — the keyword leg's inverted index, kept from ``chunks.tsv`` by triggers: since
  m006 one row per (lexeme, user, block) with the block's chunk ids, term frequencies and chunk
  lengths as arrays (an INSERT statement's chunks make one block per lexeme); one trigger per
  INSERT statement, one per DELETE statement, one per chunk whose words change.
* ``progress`` — per session, how far its messages are chunked (the claim row, locked with
  ``FOR UPDATE SKIP LOCKED`` by whichever node indexes it), and its chunks' count and total
  length (the rows ``corpus`` sums).
* ``corpus`` — BM25's N and total length in ``CORPUS_SHARDS`` rows, kept from ``progress`` by a
  trigger (m003): a search sums a fixed number of rows, however many sessions there are, and
  there is no one hot row every node would update.
* ``embedding_cache`` — (provider, model, endpoint_hash, content_hash) → int8 vector and its
  width, shared by every node.
* ``meta`` — key/value: the embedder identity whose vectors fill ``chunks.embedding``, the
  width of the vector index once one exists, and during a rebuild ``vector_rebuild``,
  ``embedder_previous`` and ``vector_dims_previous`` (:mod:`memory.pg.vectors`).
* ``facts``, ``episodes``, ``episode_jobs``, ``forgotten`` — as the SQLite index holds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from sessions import apply_migrations, pg_ledger

__all__ = ["CORPUS_SHARDS", "MIGRATIONS", "MIGRATION_LOCK", "TS_CONFIG", "migrate"]

# A constant per package (the sessions package has its own): ASCII "rcldmem" folded into 63 bits.
MIGRATION_LOCK = 0x72636C646D656D

# English stemming without a stopword list: FTS5's ``porter unicode61`` keeps every word and
# counts it in a chunk's length, and BM25 here must see the same words (the query side drops
# function words itself, memory.retrieval.request.STOPWORDS).
TS_CONFIG = "recalld_memory_fts"

# Rows of ``recalld_memory_corpus`` (m003): enough that concurrent writers seldom share one.
CORPUS_SHARDS = 16

_M001 = f"""
CREATE TEXT SEARCH DICTIONARY recalld_memory_stem (TEMPLATE = snowball, Language = english);
CREATE TEXT SEARCH CONFIGURATION {TS_CONFIG} (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION {TS_CONFIG}
  ALTER MAPPING FOR asciiword, word, hword_part, hword_asciipart, asciihword, hword, numword,
                    hword_numpart, numhword
  WITH recalld_memory_stem;

CREATE TABLE recalld_memory_meta (key text PRIMARY KEY, value text NOT NULL);

CREATE TABLE recalld_memory_chunks (
  id           bigserial PRIMARY KEY,
  user_id      text    NOT NULL,
  session_key  text    NOT NULL,
  chunk_idx    integer NOT NULL,
  content      text    NOT NULL,
  line_start   integer NOT NULL,
  line_end     integer NOT NULL,
  seq_start    bigint  NOT NULL,
  seg_start    integer NOT NULL,
  start_ts     text,
  end_ts       text,
  start_ms     bigint,
  end_ms       bigint,
  content_hash text    NOT NULL,
  vector_hash  text    NOT NULL,
  tsv          tsvector NOT NULL,
  doc_len      integer NOT NULL,
  embedding    halfvec,
  UNIQUE (session_key, chunk_idx));
CREATE INDEX recalld_memory_chunks_user ON recalld_memory_chunks (user_id, session_key);
CREATE INDEX recalld_memory_chunks_pending ON recalld_memory_chunks (vector_hash) WHERE embedding IS NULL;

-- The keyword leg's inverted index: one row per (lexeme, chunk) with its term frequency, kept
-- from chunks.tsv by a trigger, so BM25 reads postings instead of unpacking every matching
-- chunk's tsvector (user_id and doc_len copied so the leg needs no chunk row without a filter).
CREATE TABLE recalld_memory_postings (
  lexeme   text    NOT NULL,
  user_id  text    NOT NULL,
  chunk_id bigint  NOT NULL,
  tf       integer NOT NULL,
  doc_len  integer NOT NULL,
  PRIMARY KEY (lexeme, user_id, chunk_id));
CREATE INDEX recalld_memory_postings_chunk ON recalld_memory_postings (chunk_id);
CREATE FUNCTION recalld_memory_postings_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    DELETE FROM recalld_memory_postings WHERE chunk_id = OLD.id;
  END IF;
  IF TG_OP IN ('INSERT', 'UPDATE') THEN
    INSERT INTO recalld_memory_postings (lexeme, user_id, chunk_id, tf, doc_len)
    SELECT u.lexeme, NEW.user_id, NEW.id, coalesce(array_length(u.positions, 1), 1), NEW.doc_len
    FROM unnest(NEW.tsv) AS u;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER recalld_memory_postings_sync
  AFTER INSERT OR DELETE OR UPDATE OF tsv, doc_len, user_id ON recalld_memory_chunks
  FOR EACH ROW EXECUTE FUNCTION recalld_memory_postings_sync();

CREATE TABLE recalld_memory_progress (
  session_key    text PRIMARY KEY,
  user_id        text NOT NULL,
  indexed_seq    bigint NOT NULL DEFAULT -1,
  indexed_count  integer NOT NULL DEFAULT 0,
  seen_count     integer NOT NULL DEFAULT -1,
  seen_updated   text NOT NULL DEFAULT '',
  chunking       text NOT NULL DEFAULT '',
  n_chunks       bigint NOT NULL DEFAULT 0,
  total_len      bigint NOT NULL DEFAULT 0,
  indexed_at     timestamptz);

CREATE TABLE recalld_memory_embedding_cache (
  provider      text NOT NULL,
  model         text NOT NULL,
  endpoint_hash text NOT NULL,
  content_hash  text NOT NULL,
  dims          integer NOT NULL,
  vector        bytea NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (provider, model, endpoint_hash, content_hash));

-- An int8 cache vector as a halfvec of the same integers (exact in half precision).
CREATE FUNCTION recalld_memory_int8_halfvec(v bytea) RETURNS halfvec
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT array_agg(((get_byte(v, i) + 128) % 256 - 128)::real ORDER BY i)::halfvec
  FROM generate_series(0, length(v) - 1) AS i
$$;
"""  # noqa: E501  (an applied migration's SQL is never edited, long lines included)

_M002 = """
CREATE TABLE recalld_memory_facts (
  id           bigserial PRIMARY KEY,
  user_id      text NOT NULL,
  text         text NOT NULL,
  text_hash    text NOT NULL,
  active       boolean NOT NULL DEFAULT true,
  previous_id  bigint,
  origin_id    bigint,
  source       text NOT NULL,
  session_key  text,
  run_id       text,
  created_at   text NOT NULL,
  updated_at   text NOT NULL,
  said_ms      bigint NOT NULL,
  vector       bytea,
  vector_model text);
CREATE INDEX recalld_memory_facts_user ON recalld_memory_facts (user_id, active, text_hash);
CREATE INDEX recalld_memory_facts_origin ON recalld_memory_facts (origin_id);

CREATE TABLE recalld_memory_episodes (
  id            bigserial PRIMARY KEY,
  user_id       text NOT NULL,
  session_key   text NOT NULL,
  text          text NOT NULL,
  theme         text NOT NULL,
  day           text NOT NULL,
  week          text NOT NULL,
  year          integer NOT NULL,
  created_ms    bigint NOT NULL,
  updated_ms    bigint NOT NULL,
  covered_ms    bigint NOT NULL,
  merges        integer NOT NULL DEFAULT 0,
  vector        bytea,
  vector_model  text);
CREATE INDEX recalld_memory_episodes_user ON recalld_memory_episodes (user_id, updated_ms);
CREATE INDEX recalld_memory_episodes_session ON recalld_memory_episodes (user_id, session_key, covered_ms);

CREATE TABLE recalld_memory_episode_jobs (
  id           bigserial PRIMARY KEY,
  user_id      text NOT NULL,
  session_key  text NOT NULL,
  created_ms   bigint NOT NULL,
  attempts     integer NOT NULL DEFAULT 0,
  next_ms      bigint NOT NULL,
  last_error   text,
  failed       boolean NOT NULL DEFAULT false,
  UNIQUE (user_id, session_key));

CREATE TABLE recalld_memory_forgotten (
  id          bigserial PRIMARY KEY,
  user_id     text NOT NULL,
  session_key text,
  after_ms    bigint,
  before_ms   bigint,
  created_at  timestamptz NOT NULL DEFAULT now());
"""  # noqa: E501  (an applied migration's SQL is never edited, long lines included)

# Bulk indexing writes a batch of chunks in one statement; a per-row trigger would still pay one
# function call and one small INSERT per chunk. A chunk's postings now come from one statement
# per INSERT (its transition table); updates of a chunk's words and deletes stay per row (rare,
# and a per-row DELETE finds the postings by chunk id instead of a plan over a transition table).
#
# BM25's N and average length were summed over every progress row by each keyword search (a
# cost that grows with the sessions). ``corpus`` keeps the same sums in CORPUS_SHARDS rows,
# moved by a trigger on every change of a progress row's counts; a writer adds its change to
# the row of its backend (``pg_backend_pid() % CORPUS_SHARDS``), so two nodes' indexers rarely
# wait on one row, and a search sums a fixed number of rows.
#
# Each posting costs a btree insert per index, most of a bulk build's time: the second index
# (by chunk id) goes, and a chunk's postings are found by the primary key from its own ``tsv``
# (which they were made from), so a batch's postings are inserted in key order.
_M003 = f"""
CREATE FUNCTION recalld_memory_postings_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO recalld_memory_postings (lexeme, user_id, chunk_id, tf, doc_len)
  SELECT u.lexeme, n.user_id, n.id, coalesce(array_length(u.positions, 1), 1), n.doc_len
  FROM inserted n CROSS JOIN LATERAL unnest(n.tsv) AS u
  ORDER BY u.lexeme, n.user_id, n.id;
  RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION recalld_memory_postings_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    DELETE FROM recalld_memory_postings p USING unnest(OLD.tsv) AS u
    WHERE p.lexeme = u.lexeme AND p.user_id = OLD.user_id AND p.chunk_id = OLD.id;
  END IF;
  IF TG_OP = 'UPDATE' THEN
    INSERT INTO recalld_memory_postings (lexeme, user_id, chunk_id, tf, doc_len)
    SELECT u.lexeme, NEW.user_id, NEW.id, coalesce(array_length(u.positions, 1), 1), NEW.doc_len
    FROM unnest(NEW.tsv) AS u;
  END IF;
  RETURN NULL;
END $$;
DROP INDEX recalld_memory_postings_chunk;
DROP TRIGGER recalld_memory_postings_sync ON recalld_memory_chunks;
CREATE TRIGGER recalld_memory_postings_rows
  AFTER DELETE OR UPDATE OF tsv, doc_len, user_id ON recalld_memory_chunks
  FOR EACH ROW EXECUTE FUNCTION recalld_memory_postings_sync();
CREATE TRIGGER recalld_memory_postings_inserted
  AFTER INSERT ON recalld_memory_chunks REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION recalld_memory_postings_insert();

CREATE TABLE recalld_memory_corpus (
  shard     integer PRIMARY KEY,
  n_chunks  bigint NOT NULL DEFAULT 0,
  total_len bigint NOT NULL DEFAULT 0);
INSERT INTO recalld_memory_corpus (shard) SELECT generate_series(0, {CORPUS_SHARDS - 1});
UPDATE recalld_memory_corpus SET (n_chunks, total_len) =
  (SELECT coalesce(sum(n_chunks), 0), coalesce(sum(total_len), 0) FROM recalld_memory_progress)
WHERE shard = 0;
CREATE FUNCTION recalld_memory_corpus_sync() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  d_chunks bigint;
  d_len    bigint;
BEGIN
  IF TG_OP = 'UPDATE' THEN
    SELECT coalesce(sum(n.n_chunks - o.n_chunks), 0), coalesce(sum(n.total_len - o.total_len), 0)
    INTO d_chunks, d_len FROM new_rows n JOIN old_rows o USING (session_key);
  ELSIF TG_OP = 'INSERT' THEN
    SELECT coalesce(sum(n_chunks), 0), coalesce(sum(total_len), 0) INTO d_chunks, d_len FROM new_rows;
  ELSE
    SELECT -coalesce(sum(n_chunks), 0), -coalesce(sum(total_len), 0) INTO d_chunks, d_len FROM old_rows;
  END IF;
  IF d_chunks <> 0 OR d_len <> 0 THEN
    UPDATE recalld_memory_corpus SET n_chunks = n_chunks + d_chunks, total_len = total_len + d_len
    WHERE shard = pg_backend_pid() % {CORPUS_SHARDS};
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER recalld_memory_corpus_updated
  AFTER UPDATE ON recalld_memory_progress REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION recalld_memory_corpus_sync();
CREATE TRIGGER recalld_memory_corpus_inserted
  AFTER INSERT ON recalld_memory_progress REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION recalld_memory_corpus_sync();
CREATE TRIGGER recalld_memory_corpus_deleted
  AFTER DELETE ON recalld_memory_progress REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION recalld_memory_corpus_sync();
"""  # noqa: E501  (an applied migration's SQL is never edited, long lines included)

# The client token a fact was saved through (``recalld token add NAME``); NULL: the user's own.
_M004 = """
ALTER TABLE recalld_memory_facts ADD COLUMN client TEXT;
"""

# A statement's postings are sorted by lexeme alone before they are inserted (m003 sorted them by
# the whole key). The order is for the btree's sake only: a statement's chunk ids are all newer
# than the index's, so one lexeme's new postings land at the end of that lexeme's range in
# whatever order they come, while the many ties on the lexeme (a 1,000-chunk statement's ~110k
# postings share a few thousand lexemes) no longer compare the user's text and the chunk id.
# Measured inserting 6,000 chunks in 1,000-chunk statements: 1.66–1.69 s against 1.92–1.98 s
# with the whole key, 2.01–2.20 s unsorted.
_M005 = """
CREATE OR REPLACE FUNCTION recalld_memory_postings_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO recalld_memory_postings (lexeme, user_id, chunk_id, tf, doc_len)
  SELECT u.lexeme, n.user_id, n.id, coalesce(array_length(u.positions, 1), 1), n.doc_len
  FROM inserted n CROSS JOIN LATERAL unnest(n.tsv) AS u
  ORDER BY u.lexeme;
  RETURN NULL;
END $$;
"""

# Postings in blocks (round 4): one row per (lexeme, user, block) holding the block's chunk ids,
# term frequencies and chunk lengths as arrays, instead of one row per (lexeme, chunk). An INSERT
# statement's postings become one block per lexeme (a 1,000-chunk statement's ~110k postings, a
# few thousand rows): each posting row had cost a tuple header, an index entry and a WAL record,
# over half of a bulk build (docs/scaling.md). ``block`` is a label no greater than any chunk id
# in it (the statement's first id for that lexeme), so a chunk's block for a lexeme is the first
# one holding its id at or below it: one backward index scan. Deletes are one statement-level
# trigger (each block touched rewritten once, however many of its chunks go); an update of a
# chunk's words (a session's last chunk re-cut by an append) moves it to the block labelled with
# its own id. Existing postings are regrouped in blocks of 1,024 ids.
_M006 = """
ALTER TABLE recalld_memory_postings RENAME TO recalld_memory_postings_m005;
ALTER INDEX recalld_memory_postings_pkey RENAME TO recalld_memory_postings_m005_pkey;
CREATE TABLE recalld_memory_postings (
  lexeme    text      NOT NULL,
  user_id   text      NOT NULL,
  block     bigint    NOT NULL,
  chunk_ids bigint[]  NOT NULL,
  tfs       integer[] NOT NULL,
  doc_lens  integer[] NOT NULL,
  PRIMARY KEY (lexeme, user_id, block));
INSERT INTO recalld_memory_postings (lexeme, user_id, block, chunk_ids, tfs, doc_lens)
SELECT lexeme, user_id, min(chunk_id), array_agg(chunk_id ORDER BY chunk_id),
       array_agg(tf ORDER BY chunk_id), array_agg(doc_len ORDER BY chunk_id)
FROM recalld_memory_postings_m005
GROUP BY lexeme, user_id, chunk_id >> 10
ORDER BY lexeme;
DROP TABLE recalld_memory_postings_m005;

CREATE OR REPLACE FUNCTION recalld_memory_postings_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO recalld_memory_postings (lexeme, user_id, block, chunk_ids, tfs, doc_lens)
  SELECT u.lexeme, n.user_id, min(n.id), array_agg(n.id ORDER BY n.id),
         array_agg(coalesce(array_length(u.positions, 1), 1) ORDER BY n.id),
         array_agg(n.doc_len ORDER BY n.id)
  FROM inserted n CROSS JOIN LATERAL unnest(n.tsv) AS u
  GROUP BY u.lexeme, n.user_id
  ORDER BY u.lexeme;
  RETURN NULL;
END $$;

CREATE FUNCTION recalld_memory_postings_deleted() RETURNS trigger LANGUAGE plpgsql
SET work_mem = '64MB' AS $$
DECLARE
  e_lexeme text[];
  e_user   text[];
  e_block  bigint[];
BEGIN
  WITH hit AS (
    SELECT DISTINCT b.lexeme, b.user_id, b.block
    FROM gone g CROSS JOIN LATERAL unnest(g.tsv) AS u CROSS JOIN LATERAL (
      SELECT p.lexeme, p.user_id, p.block FROM recalld_memory_postings p
      WHERE p.lexeme = u.lexeme AND p.user_id = g.user_id AND p.block <= g.id
        AND g.id = ANY(p.chunk_ids)
      ORDER BY p.block DESC LIMIT 1) AS b),
  kept AS (
    UPDATE recalld_memory_postings p SET (chunk_ids, tfs, doc_lens) = (
      SELECT coalesce(array_agg(x.c ORDER BY x.o), '{}'),
             coalesce(array_agg(x.t ORDER BY x.o), '{}'),
             coalesce(array_agg(x.l ORDER BY x.o), '{}')
      FROM unnest(p.chunk_ids, p.tfs, p.doc_lens) WITH ORDINALITY AS x(c, t, l, o)
      WHERE x.c NOT IN (SELECT id FROM gone))
    FROM hit WHERE p.lexeme = hit.lexeme AND p.user_id = hit.user_id AND p.block = hit.block
    RETURNING p.lexeme, p.user_id, p.block, cardinality(p.chunk_ids) AS left_)
  SELECT array_agg(lexeme), array_agg(user_id), array_agg(block)
  INTO e_lexeme, e_user, e_block FROM kept WHERE left_ = 0;
  IF e_lexeme IS NOT NULL THEN
    DELETE FROM recalld_memory_postings p
    USING unnest(e_lexeme, e_user, e_block) AS e(lexeme, user_id, block)
    WHERE p.lexeme = e.lexeme AND p.user_id = e.user_id AND p.block = e.block
      AND cardinality(p.chunk_ids) = 0;
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION recalld_memory_postings_sync() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  e_lexeme text[];
  e_block  bigint[];
BEGIN
  -- Removed by value from the row as it is when updated: another transaction may have changed
  -- the block since this statement's snapshot (its other chunks are other sessions').
  WITH hit AS (
    SELECT b.lexeme, b.block
    FROM unnest(OLD.tsv) AS u CROSS JOIN LATERAL (
      SELECT p.lexeme, p.block FROM recalld_memory_postings p
      WHERE p.lexeme = u.lexeme AND p.user_id = OLD.user_id AND p.block <= OLD.id
        AND OLD.id = ANY(p.chunk_ids)
      ORDER BY p.block DESC LIMIT 1) AS b),
  kept AS (
    UPDATE recalld_memory_postings p SET (chunk_ids, tfs, doc_lens) = (
      SELECT coalesce(array_agg(x.c ORDER BY x.o), '{}'),
             coalesce(array_agg(x.t ORDER BY x.o), '{}'),
             coalesce(array_agg(x.l ORDER BY x.o), '{}')
      FROM unnest(p.chunk_ids, p.tfs, p.doc_lens) WITH ORDINALITY AS x(c, t, l, o)
      WHERE x.c <> OLD.id)
    FROM hit
    WHERE p.lexeme = hit.lexeme AND p.user_id = OLD.user_id AND p.block = hit.block
      AND OLD.id = ANY(p.chunk_ids)
    RETURNING p.lexeme, p.block, cardinality(p.chunk_ids) AS left_)
  SELECT array_agg(lexeme), array_agg(block) INTO e_lexeme, e_block FROM kept WHERE left_ = 0;
  IF e_lexeme IS NOT NULL THEN
    DELETE FROM recalld_memory_postings p USING unnest(e_lexeme, e_block) AS e(lexeme, block)
    WHERE p.lexeme = e.lexeme AND p.user_id = OLD.user_id AND p.block = e.block
      AND cardinality(p.chunk_ids) = 0;
  END IF;
  INSERT INTO recalld_memory_postings AS p (lexeme, user_id, block, chunk_ids, tfs, doc_lens)
  SELECT u.lexeme, NEW.user_id, NEW.id, ARRAY[NEW.id],
         ARRAY[coalesce(array_length(u.positions, 1), 1)], ARRAY[NEW.doc_len]
  FROM unnest(NEW.tsv) AS u
  ON CONFLICT (lexeme, user_id, block) DO UPDATE
    SET chunk_ids = p.chunk_ids || excluded.chunk_ids, tfs = p.tfs || excluded.tfs,
        doc_lens = p.doc_lens || excluded.doc_lens;
  RETURN NULL;
END $$;

DROP TRIGGER recalld_memory_postings_rows ON recalld_memory_chunks;
CREATE TRIGGER recalld_memory_postings_rows
  AFTER UPDATE OF tsv, doc_len, user_id ON recalld_memory_chunks
  FOR EACH ROW EXECUTE FUNCTION recalld_memory_postings_sync();
CREATE TRIGGER recalld_memory_postings_deleted
  AFTER DELETE ON recalld_memory_chunks REFERENCING OLD TABLE AS gone
  FOR EACH STATEMENT EXECUTE FUNCTION recalld_memory_postings_deleted();
"""

# The vectors of the identity that was complete before an embedder change, kept while the new
# model's are built (memory.pg.vectors, "Embedder change"): no default, so adding it rewrites
# nothing. (IF NOT EXISTS: the m006 upgrade test adds it ahead, for this version's indexer.)
_M007 = """
ALTER TABLE recalld_memory_chunks ADD COLUMN IF NOT EXISTS embedding_previous halfvec;
"""

MIGRATIONS: Sequence[tuple[str, str]] = (
    ("m001_chunks_cache_progress", _M001),
    ("m002_facts_episodes_forgotten", _M002),
    ("m003_statement_postings_corpus_totals", _M003),
    ("m004_fact_client", _M004),
    ("m005_postings_sorted_by_lexeme", _M005),
    ("m006_postings_in_blocks", _M006),
    ("m007_previous_embedding", _M007),
)

def migrate(conn: psycopg.Connection[object], *, before: str | None = None) -> list[str]:
    """Apply every migration not yet recorded, in order, in one transaction under the lock;
    return the names applied here (empty when another node, or an earlier start, did it).
    ``before`` (a migration's name) stops short of it: the schema an older version left, for
    the tests and studies of an upgrade."""
    steps = MIGRATIONS if before is None else MIGRATIONS[:[n for n, _ in MIGRATIONS].index(before)]
    # CREATE EXTENSION takes its own lock; IF NOT EXISTS under ours keeps two nodes from racing it.
    with pg_ledger(conn, table="recalld_memory_migrations", lock=MIGRATION_LOCK,
                   prelude=("CREATE EXTENSION IF NOT EXISTS vector",)) as ledger:
        return apply_migrations(ledger, steps)
