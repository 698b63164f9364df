"""What an embedder change costs on PostgreSQL at 100k chunks: the transaction that starts the
rebuild (every vector moved to ``embedding_previous``), and searches while the previous model
serves (an exact scan of the user's previous vectors) against the HNSW leg before the change.

``python -m research.pg_previous [--size 100000] [--queries 100]``: the scale corpus
(``bench.scalecorpus``, cached) loaded into a throwaway PostgreSQL and indexed once, as
``make bench-cluster`` does; the same queries through ``PgMemory.search`` (vector and hybrid,
k = 6, library ``searchMs``) on a node of the corpus's model, then on a node of another model
whose embedder is down (its rebuild cannot progress) with the corpus's model as the previous one;
the second node's first pass is the change, timed; recall@10 of the previous leg's vector hits
against the exact float scan (``bench.scale.exact_truth``), as ``research.hnsw_ef`` reads it;
then a full reindex on that node (every chunk re-cut, the previous vectors read back from the
cache), timed, with the same searches again; and, for comparison, the same reindex on the first
node, before the change.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import clustersearch
from bench.corpus import USER, bench_memory_config, queries
from bench.scale import exact_truth, structlog_quiet
from bench.scalecorpus import build
from bench.scalecorpus import embedder as make_embedder
from bench.stats import summary_ms
from memory.embedders.previous import EmbedderIdentity
from memory.errors import EmbedderError
from testkit.postgres import running_postgres

MODES = ("vector", "hybrid")


class _Down:
    """Another model (another identity, the same window: nothing is re-chunked) whose every call
    fails, so the rebuild stays pending."""

    provider, model_id, endpoint_hash = "bench", "another-model", "none"
    relevance_floor, batch_size = None, 32

    def __init__(self, like: Any) -> None:
        self.dims, self.max_tokens = like.dims, like.max_tokens

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        raise EmbedderError("bench: the new model is down", retryable=False)


async def _searches(service: Any, qs: list[str]) -> dict[str, Any]:
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for q in qs:
        for m in MODES:
            r = await service.search(USER, q, k=6, mode=m)
            if r.mode != m:
                raise RuntimeError(f"{m} ran as {r.mode}: {r.fallback_reason}")
            times[m].append(r.timings_ms["searchMs"] / 1000)
    hits = [[(h.session_key, h.line_start)
             for h in (await service.search(USER, q, k=10, mode="vector")).results] for q in qs]
    return {"times": {m: summary_ms(v) for m, v in times.items()}, "hits": hits,
            "previous": r.previous_model}


async def _measure(dsn: str, qs: list[str]) -> dict[str, Any]:
    from memory.pg.service import PgMemory

    old: Any = make_embedder()   # synthetic: its max_tokens is None, typed apart from Embedder's
    opened: dict[str, Any] = {"data_dir": Path(tempfile.gettempdir()),
                              "embedder_reason": "bench: synthetic", "poll_s": 3600.0}
    before = await PgMemory.open(dsn, bench_memory_config(), old, **opened)
    try:
        normal = await _searches(before, qs)
        started = time.perf_counter()
        await before.sync_now(full=True)   # the same reindex with no rebuild running
        plain_reindex_s = time.perf_counter() - started
    finally:
        await before.close()
    def factory(identity: EmbedderIdentity) -> tuple[Any, str]:
        return (old, "bench") if identity == EmbedderIdentity.of(old) else (None, "not its")

    down: Any = _Down(old)
    after = await PgMemory.open(dsn, bench_memory_config(), down, previous_embedder=factory,
                                **opened)
    try:
        started = time.perf_counter()
        await after.sync_now()   # the change, then the embedder's failure (the report says so)
        change_s = time.perf_counter() - started
        during = await _searches(after, qs)
        started = time.perf_counter()
        await after.sync_now(full=True)   # every chunk re-cut: the previous vectors refilled
        reindex_s = time.perf_counter() - started
        reindexed = await _searches(after, qs)
    finally:
        await after.close()
    return {"normal": normal, "previous": during, "reindexed": reindexed, "changeS": change_s,
            "reindexS": reindex_s, "plainReindexS": plain_reindex_s}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m research.pg_previous")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    structlog_quiet()
    corpus = build(args.size, log=print)
    qs = queries(args.queries)
    with running_postgres() as server:
        dsn = server.create_database("pg_previous")
        clustersearch.load_transcripts(corpus.data_dir, dsn)
        indexed = asyncio.run(clustersearch.index_postgres(corpus.data_dir, dsn))
        print(f"indexed {indexed['chunks']:,} chunks (vectors and HNSW in "
              f"{indexed['indexS']:.0f} s)")
        results = asyncio.run(_measure(dsn, qs))
    truth = exact_truth(corpus.data_dir, make_embedder(), qs)
    names = clustersearch._sqlite_keys(corpus.data_dir)
    print(f"the change (every vector moved to embedding_previous): {results['changeS']:.1f} s")
    print(f"a full reindex during the rebuild (every chunk re-cut, its previous vector read "
          f"back from the cache): {results['reindexS']:.1f} s; the same with no rebuild "
          f"running: {results['plainReindexS']:.1f} s")
    print(f"{'leg':>22}  {'mode':>6}  {'p50 ms':>7}  {'p99 ms':>7}  {'recall@10':>9}")
    for name, label in (("normal", "HNSW, before"), ("previous", "previous model, during"),
                        ("reindexed", "previous, reindexed")):
        got = results[name]
        recall = sum(len(set(hits) & {names[i] for i in want}) / 10
                     for hits, want in zip(got["hits"], truth, strict=True)) / len(truth)
        for m in MODES:
            s = got["times"][m]
            print(f"{label:>22}  {m:>6}  {s['p50']:>7.1f}  {s['p99']:>7.1f}  "
                  f"{recall if m == 'vector' else float('nan'):>9.3f}")
    print(f"previousModel during: {results['previous']['previous']!r}")


if __name__ == "__main__":
    main()
