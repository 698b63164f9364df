"""What PostgreSQL postings in blocks (migration m006) cost where they could cost more than a
row per posting: the migration of an index built before it, the changes that rewrite a block
(a chunk re-cut by an append, a session deleted), and keyword searches.

``python -m research.pg_blocks [--size 100000] [--repeat 20]``: the scale corpus
(``bench.scalecorpus``, cached) loaded into one throwaway PostgreSQL (``testkit.postgres``),
migrated up to m005 and indexed keyword-only (``PgIndexer``, no embedder: one posting row per
lexeme and chunk). Then, on the m005 layout and again after ``migrate()`` applied m006 (timed):

* a re-cut: one chunk's words changed (its ``tsv`` and length, as an append's upsert changes
  them), ``--repeat`` chunks picked evenly over the ids, each in its own transaction;
* a deleted session: ``--repeat`` sessions' chunks deleted, each in its own transaction;
* keyword searches after m006: ``bench.corpus``'s queries through ``PgSearch`` (library
  time; the m005 layout's are ``python -m bench.cluster --only search`` on the code before it).

Every change is rolled back, so both layouts see the same index. Medians and p90 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench import clustersearch
from bench.corpus import USER, bench_memory_config, queries
from bench.scale import structlog_quiet
from bench.scalecorpus import build
from testkit.postgres import running_postgres

_RECUT = """
UPDATE recalld_memory_chunks SET tsv = to_tsvector('{ts}', content || ' swarm'),
  doc_len = doc_len + 1 WHERE id = %s"""


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"p50 {statistics.median(xs):.1f} / p90 {xs[int(0.9 * (len(xs) - 1))]:.1f} ms"


def _changes(dsn: str, repeat: int) -> dict[str, str]:
    import psycopg

    from memory.pg.migrations import TS_CONFIG

    with psycopg.connect(dsn) as conn:
        ids = [int(r[0]) for r in conn.execute(
            "SELECT min(id) FROM (SELECT id, ntile(%s) OVER (ORDER BY id) AS t"
            " FROM recalld_memory_chunks) AS s GROUP BY t ORDER BY 1", (repeat,)).fetchall()]
        keys = [str(r[0]) for r in conn.execute(
            "SELECT session_key FROM recalld_memory_progress ORDER BY md5(session_key) LIMIT %s",
            (repeat,)).fetchall()]
        conn.rollback()
        recut, deleted = [], []
        for chunk_id in ids:
            t0 = time.perf_counter()
            conn.execute(_RECUT.format(ts=TS_CONFIG), (chunk_id,))
            recut.append((time.perf_counter() - t0) * 1000)
            conn.rollback()
        for key in keys:
            t0 = time.perf_counter()
            conn.execute("DELETE FROM recalld_memory_chunks WHERE session_key = %s", (key,))
            deleted.append((time.perf_counter() - t0) * 1000)
            conn.rollback()
    return {"re-cut of one chunk": _ms(recut), "a session's chunks deleted": _ms(deleted)}


async def _searches(dsn: str, queries: list[str]) -> str:
    from psycopg_pool import AsyncConnectionPool

    from memory.pg.search import PgSearch
    from memory.retrieval.request import SearchRequest

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
    await pool.open()
    try:
        search = PgSearch(pool, bench_memory_config())
        times = []
        for rnd in range(2):
            for q in queries:
                t0 = time.perf_counter()
                await search.search(SearchRequest(user=USER, query=q, k=6, mode="keyword"),
                                    query_vector=None)
                if rnd:  # the first round warms the caches
                    times.append((time.perf_counter() - t0) * 1000)
        return _ms(times)
    finally:
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.pg_blocks",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    import psycopg

    from memory.pg.migrations import migrate

    structlog_quiet()
    corpus = build(args.size, log=lambda line: print(line, flush=True))
    texts = queries(50)
    with running_postgres() as server:
        dsn = server.create_database("blocks")
        clustersearch.load_transcripts(corpus.data_dir, dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, before="m006_postings_in_blocks")
        timed = asyncio.run(clustersearch._keyword_only_postgres(dsn))
        print(f"m005 keyword-only build: {timed['keywordChunks']:,} chunks in "
              f"{timed['keywordS']:.1f} s", flush=True)
        for layout in ("m005 (a row per posting)", "m006 (blocks)"):
            if layout.startswith("m006"):
                with psycopg.connect(dsn, autocommit=True) as conn:
                    t0 = time.perf_counter()
                    migrate(conn)
                    print(f"m006 migration of {timed['keywordChunks']:,} chunks' postings: "
                          f"{time.perf_counter() - t0:.1f} s", flush=True)
                    conn.execute("VACUUM ANALYZE")
            for what, figure in _changes(dsn, args.repeat).items():
                print(f"{layout}: {what}: {figure}", flush=True)
            if layout.startswith("m006"):  # this checkout's search reads blocks only
                print(f"{layout}: keyword search: {asyncio.run(_searches(dsn, texts))}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
