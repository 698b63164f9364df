"""Does the re-rank step's back-off (``memory.rerank_max_concurrent``) help when searches queue?

One index of a dataset (the local embedder; ``--embedding-cache`` as ``bench.recall`` takes it),
one ``MemoryService`` with ``rerank = "auto"``. ``--clients`` tasks then search back to back,
each walking the dataset's questions (hybrid, k 10), for ``--seconds``; the same load runs with
the back-off (``rerank_max_concurrent`` 1, the default) and without it (a limit no load reaches),
alternated ``--rounds`` times in this process. Per setting: searches/s, p50 / p99 latency, the
share of searches whose step ran, backed off, or was skipped (legs agreeing or nothing fits), the
candidates read per step, and R@5 and nDCG@10 of the searches made (the question's evidence
turns among the results' turns; the step re-orders the top 10 only, so R@10 cannot move), so a
faster answer that is worse shows as such.

    .venv/bin/python -m research.rerank_backoff bench/data/sample.json --clients 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.recall import (
    _share_cache,
    hits_to_turns,
    load_corpus,
    load_dataset,
    longest_turn_tokens,
    memory_config,
    ndcg_at,
    recall_at,
)
from bench.stats import summary_ms
from memory import MemoryService
from memory.embedders.embeddings import select_embedder

NO_LIMIT = 1_000_000


async def _load(path: Path, root: Path, cache: Path | None) -> tuple[MemoryService, list[Any]]:
    dataset = load_dataset(path)
    config = replace(memory_config("chunk", embedder="local", k=10, rrf_k=60, candidates=50,
                                   max_turn_tokens=longest_turn_tokens(dataset)), rerank="auto")
    embedder, reason = select_embedder(config)
    if embedder is None:
        raise SystemExit(f"the local embedder is not available: {reason}")
    service = MemoryService(root, config, embedder, embedder_reason=reason)
    await service.start(catch_up=False)
    corpus = await asyncio.to_thread(load_corpus, dataset, root, "chunk", None)
    if cache is not None and cache.exists():
        await asyncio.to_thread(_share_cache, root / "memory.db", cache, "seed")
    await service.sync_now()
    if cache is not None:
        await asyncio.to_thread(_share_cache, root / "memory.db", cache, "keep")
    asks = [(corpus.users[q.conversation], q.question, q.evidence, corpus.line_map)
            for q in dataset.questions]
    return service, asks


async def _load_round(service: MemoryService, asks: Sequence[Any], clients: int,
                      seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    states = {"ran": 0, "backedOff": 0, "skipped": 0}
    read: list[float] = []
    recalls: list[float] = []
    ndcgs: list[float] = []
    stop = time.perf_counter() + seconds

    async def client(n: int) -> None:
        i = n * 7
        while time.perf_counter() < stop:
            user, question, evidence, line_map = asks[i % len(asks)]
            i += 1
            started = time.perf_counter()
            response = await service.search(user, question, k=10)
            latencies.append(time.perf_counter() - started)
            timings = response.timings_ms
            if "rerankBusy" in timings:
                states["backedOff"] += 1
            elif "reranked" in timings:
                states["ran"] += 1
                read.append(timings["reranked"])
            else:
                states["skipped"] += 1
            ranked = [hits_to_turns(h, line_map) for h in response.results]
            recalls.append(recall_at(ranked, evidence, 5))
            ndcgs.append(ndcg_at(ranked, evidence, 10))

    began = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - began
    m = summary_ms(latencies)
    total = len(latencies)
    return {"searches": total, "per_s": total / elapsed, "p50": m["p50"], "p99": m["p99"],
            **{k: v / total for k, v in states.items()},
            "read": statistics.mean(read) if read else 0.0,
            "r5": statistics.mean(recalls) if recalls else 0.0,
            "ndcg": statistics.mean(ndcgs) if ndcgs else 0.0}


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--embedding-cache", type=Path,
                        default=Path("bench/.cache/recall-embeddings.sqlite"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recalld-backoff-") as tmp:
        service, asks = await _load(args.dataset, Path(tmp), args.embedding_cache)
        try:
            pipeline = service._search
            base = pipeline.config
            await _load_round(service, asks, 1, 2.0)  # the model loads and calibrates
            rows: dict[str, list[dict[str, Any]]] = {"back-off (1)": [], "none": []}
            for _ in range(args.rounds):
                for name, most in (("back-off (1)", 1), ("none", NO_LIMIT)):
                    pipeline.config = replace(base, rerank_max_concurrent=most)
                    rows[name].append(await _load_round(service, asks, args.clients,
                                                        args.seconds))
        finally:
            await service.close()
    print(f"{args.clients} clients searching back to back, {args.seconds:.0f} s a round, "
          f"{args.rounds} rounds alternated; medians over rounds")
    print(f"{'setting':<14}{'search/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'ran':>7}{'backed':>8}"
          f"{'skipped':>9}{'read':>6}{'R@5':>7}{'nDCG@10':>9}")
    for name, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:<14}{med['per_s']:>9.1f}{med['p50']:>9.1f}{med['p99']:>9.1f}"
              f"{med['ran']:>7.0%}{med['backedOff']:>8.0%}{med['skipped']:>9.0%}"
              f"{med['read']:>6.1f}{med['r5']:>7.3f}{med['ndcg']:>9.3f}")
        for r in runs:
            print(f"  round: {r['per_s']:.1f}/s p50 {r['p50']:.1f} p99 {r['p99']:.1f} "
                  f"ran {r['ran']:.0%} read {r['read']:.1f} R@5 {r['r5']:.3f} "
                  f"nDCG@10 {r['ndcg']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
