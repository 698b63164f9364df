"""Where a PostgreSQL keyword-only build of the 100k scale corpus spends its time, and which
postings layout or server setting would make it faster (issue 32: ≥ 1/3 of SQLite's rate;
the answer, postings in blocks, is the product's since m006).

``python -m research.pg_build [--size 100000] [--rounds 2] [--variants now,no-postings,…]``: the
scale corpus (``bench.scalecorpus``, cached) is loaded into a fresh database of one throwaway
PostgreSQL (``testkit.postgres``) per build, the variant's SQL applied over the migrated schema,
then ``bench.clustersearch``'s keyword-only build (``PgIndexer.run_once`` without an embedder
on a pool of two connections), as ``bench.cluster`` times it. Variants alternate round by
round. Per build: chunks/s, how busy the machine was (from ``/proc/stat``), this process's CPU
seconds, the WAL written, and the postings' heap and index.

Variants (each a schema the product does not use, but ``now``; each measured for its build):

* ``now`` — the product's schema: postings in blocks (m006), one row per lexeme, user and
  INSERT statement with the statement's chunk ids, tfs and lengths as arrays;
* ``rows`` — the layout before m006: one posting row per lexeme, user and chunk;
* ``no-postings`` — the postings trigger disabled: what the chunks alone cost (an upper bound);
* ``int-terms`` — per-chunk rows with lexemes numbered in a dictionary table, keyed ``(term
  int4, user, chunk)`` with ``smallint`` tf and length (narrower keys, cheaper comparisons);
* ``narrow`` — per-chunk rows, the fixed-width columns first and ``smallint`` tf and length;
* ``unlogged`` — the postings table ``UNLOGGED`` (no WAL for them; emptied by a crash);
* ``wal-no-zero`` — ``wal_init_zero = off`` (new WAL segments are not zero-filled);
* ``big-wal`` — ``max_wal_size = 16GB`` (no checkpoint during the build).

``int-terms`` and ``narrow`` replace the table and its insert trigger only, so they measure a
build, nothing after it; they were the per-row layouts tried before m006 (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os

from bench import clustersearch
from bench.scale import structlog_quiet
from bench.scalecorpus import build
from memory.pg.migrations import MIGRATIONS
from testkit.postgres import running_postgres

_INT_TERMS = """
CREATE TABLE recalld_memory_terms (lexeme text PRIMARY KEY, id integer NOT NULL);
CREATE SEQUENCE recalld_memory_terms_id;
DROP TABLE recalld_memory_postings;
CREATE TABLE recalld_memory_postings (
  chunk_id bigint NOT NULL, term integer NOT NULL, tf smallint NOT NULL,
  doc_len smallint NOT NULL, user_id text NOT NULL, PRIMARY KEY (term, user_id, chunk_id));
CREATE OR REPLACE FUNCTION recalld_memory_postings_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO recalld_memory_terms (lexeme, id)
  SELECT l.lexeme, nextval('recalld_memory_terms_id') FROM (
    SELECT DISTINCT u.lexeme FROM inserted n CROSS JOIN LATERAL unnest(n.tsv) AS u) AS l
  WHERE NOT EXISTS (SELECT 1 FROM recalld_memory_terms t WHERE t.lexeme = l.lexeme)
  ON CONFLICT DO NOTHING;
  INSERT INTO recalld_memory_postings (chunk_id, term, tf, doc_len, user_id)
  SELECT n.id, t.id, coalesce(array_length(u.positions, 1), 1), n.doc_len, n.user_id
  FROM inserted n CROSS JOIN LATERAL unnest(n.tsv) AS u
  JOIN recalld_memory_terms t ON t.lexeme = u.lexeme
  ORDER BY t.id;
  RETURN NULL;
END $$;
"""

_NARROW = """
DROP TABLE recalld_memory_postings;
CREATE TABLE recalld_memory_postings (
  chunk_id bigint NOT NULL, tf smallint NOT NULL, doc_len smallint NOT NULL,
  lexeme text NOT NULL, user_id text NOT NULL, PRIMARY KEY (lexeme, user_id, chunk_id));
"""

# The layout before m006, one posting row per (lexeme, user, chunk), as m005 left it (its insert
# trigger is m005's own SQL).
_ROWS = """
DROP TRIGGER recalld_memory_postings_deleted ON recalld_memory_chunks;
DROP TABLE recalld_memory_postings;
CREATE TABLE recalld_memory_postings (
  lexeme text NOT NULL, user_id text NOT NULL, chunk_id bigint NOT NULL, tf integer NOT NULL,
  doc_len integer NOT NULL, PRIMARY KEY (lexeme, user_id, chunk_id));
""" + dict(MIGRATIONS)["m005_postings_sorted_by_lexeme"]

VARIANTS: dict[str, list[str]] = {
    "now": [],
    "rows": [_ROWS],
    "no-postings": ["ALTER TABLE recalld_memory_chunks "
                    "DISABLE TRIGGER recalld_memory_postings_inserted"],
    "int-terms": [_INT_TERMS],
    "narrow": [_NARROW],
    "unlogged": ["ALTER TABLE recalld_memory_postings SET UNLOGGED"],
    "wal-no-zero": ["ALTER SYSTEM SET wal_init_zero = off", "SELECT pg_reload_conf()"],
    "big-wal": ["ALTER SYSTEM SET max_wal_size = '16GB'", "SELECT pg_reload_conf()"],
}


def _cpu() -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) of the machine so far."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]


def _build(dsn: str) -> dict[str, float]:
    """``bench.clustersearch``'s timed keyword-only build, with the machine's and this
    process's CPU around it."""
    c0, p0 = _cpu(), os.times()
    timed = asyncio.run(clustersearch._keyword_only_postgres(dsn))
    c1, p1 = _cpu(), os.times()
    return {"chunks": timed["keywordChunks"], "seconds": timed["keywordS"],
            "busy": 1 - (c1[1] - c0[1]) / max(1, c1[0] - c0[0]),
            "clientCpuS": p1.user + p1.system - p0.user - p0.system}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.pg_build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="now,rows,no-postings",
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    if unknown := sorted(set(names) - set(VARIANTS)):
        parser.error(f"unknown variant(s): {', '.join(unknown)}")
    import psycopg

    from memory.pg.migrations import migrate

    structlog_quiet()
    corpus = build(args.size, log=lambda line: print(line, flush=True))
    with running_postgres() as server:
        for rnd in range(args.rounds):
            for name in names:
                db = f"build_{rnd}_{name.replace('-', '_')}"
                dsn = server.create_database(db)
                clustersearch.load_transcripts(corpus.data_dir, dsn)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    migrate(conn)
                    for sql in VARIANTS[name]:
                        conn.execute(sql)
                    conn.execute("CHECKPOINT")
                    lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
                got = _build(dsn)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    row = conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s),"
                        " pg_relation_size('recalld_memory_postings'),"
                        " pg_indexes_size('recalld_memory_postings')",
                        (lsn[0] if lsn else None,)).fetchone()
                    conn.execute("ALTER SYSTEM RESET ALL")
                    conn.execute("SELECT pg_reload_conf()")
                wal, heap, index = (float(x) / 1e6 for x in row) if row else (0.0, 0.0, 0.0)
                print(f"round {rnd + 1} {name:>11}: {got['chunks']:,} chunks in "
                      f"{got['seconds']:.1f} s = {got['chunks'] / got['seconds']:,.0f}/s; "
                      f"machine busy {got['busy']:.0%}, this process {got['clientCpuS']:.1f} "
                      f"CPU s; WAL {wal:,.0f} MB; postings heap {heap:,.0f} MB, "
                      f"index {index:,.0f} MB", flush=True)
                server.drop_database(db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
