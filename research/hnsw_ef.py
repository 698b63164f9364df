"""Which ``hnsw.ef_search`` gives the PostgreSQL vector leg recall@10 ≥ 0.95 at 100k chunks,
and what it costs per search (issue 32).

``python -m research.hnsw_ef [--size 100000] [--queries 100] [--ef 200 300 400 600]``: the
scale corpus (``bench.scalecorpus``, cached) loaded into a throwaway PostgreSQL and indexed
once, as ``make bench-cluster`` does; then for each ``ef`` the same vector queries through
``PgMemory.search`` (k = 10), recall@10 against the exact float scan of the corpus
(``bench.scale.exact_truth``) and the search's p50 / p99. ``ef_search`` is
``max(memory.pg.search.HNSW_EF_SEARCH, 4 × candidates)``; the study sets the constant.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import memory.pg.search as pgsearch
from bench import clustersearch
from bench.corpus import USER, bench_memory_config, queries
from bench.scale import exact_truth, structlog_quiet
from bench.scalecorpus import build
from bench.scalecorpus import embedder as make_embedder
from bench.stats import summary_ms
from testkit.postgres import running_postgres

Hits = list[list[tuple[str, int]]]


async def _measure(dsn: str, qs: list[str], efs: list[int]) -> dict[int, tuple[Hits, list[float]]]:
    from memory.pg.service import PgMemory

    service = await PgMemory.open(dsn, bench_memory_config(), make_embedder(),  # type: ignore[arg-type]
                                  data_dir=Path(tempfile.gettempdir()), embedder_reason="study",
                                  poll_s=3600.0)
    out: dict[int, tuple[Hits, list[float]]] = {}
    try:
        await service.search(USER, qs[0], mode="vector")  # warm
        for ef in efs:
            pgsearch.HNSW_EF_SEARCH = ef
            hits: Hits = []
            times: list[float] = []
            for q in qs:
                t = time.perf_counter()
                r = await service.search(USER, q, k=10, mode="vector")
                times.append(time.perf_counter() - t)
                hits.append([(h.session_key, h.line_start) for h in r.results])
            out[ef] = (hits, times)
    finally:
        await service.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m research.hnsw_ef")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--ef", type=int, nargs="+", default=[200, 300, 400, 600])
    args = parser.parse_args()
    structlog_quiet()
    corpus = build(args.size, log=print)
    qs = queries(args.queries)
    with running_postgres() as server:
        dsn = server.create_database("hnsw_ef")
        clustersearch.load_transcripts(corpus.data_dir, dsn)
        indexed = asyncio.run(clustersearch.index_postgres(corpus.data_dir, dsn))
        print(f"indexed {indexed['chunks']:,} chunks "
              f"(vectors and HNSW in {indexed['indexS']:.0f} s)")
        results = asyncio.run(_measure(dsn, qs, args.ef))
    truth = exact_truth(corpus.data_dir, make_embedder(), qs)
    names = clustersearch._sqlite_keys(corpus.data_dir)
    print(f"{'ef_search':>9}  {'recall@10':>9}  {'p50 ms':>7}  {'p99 ms':>7}")
    for ef, (hits, times) in results.items():
        recall = sum(len(set(got) & {names[i] for i in want}) / 10
                     for got, want in zip(hits, truth, strict=True)) / len(truth)
        s = summary_ms(times)
        print(f"{ef:>9}  {recall:>9.3f}  {s['p50']:>7.1f}  {s['p99']:>7.1f}")


if __name__ == "__main__":
    main()
