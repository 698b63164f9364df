"""``python -m research.interim [--size 100000] [--queries 200]``: the vector leg during a rebuild.

What a search costs while the previous model serves the vector leg (docs/memory.md, "Rebuild on
identity or chunking change"). A copy of the ``make bench-scale`` corpus of SIZE chunks (built
first if missing) is opened twice:

1. with its own embedder identity — the normal vector and hybrid legs, as a baseline;
2. with a new identity, before any sync starts the rebuild, so every search runs the vector
   leg over the previous identity's cached vectors (``memory.sqlite.interim``).

The previous model's "query" is a stored chunk's cached vector plus noise: this measures cost,
and recall@10 against an exact cosine scan of every cached vector of the user for the same
query vector, not retrieval quality. Figures only; nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import apsw
import numpy as np

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from bench.corpus import USER, bench_memory_config, queries  # noqa: E402
from memory.embedders.previous import EmbedderIdentity  # noqa: E402
from memory.sqlite.service import MemoryService  # noqa: E402


class CachedVectors:
    """The previous model, standing in: a query maps to a stored vector plus a little noise."""

    batch_size, remote = 8, False
    max_tokens: int | None = None

    def __init__(self, identity: EmbedderIdentity, matrix: Any,
                 model_id: str | None = None) -> None:
        self.provider, self.endpoint_hash = identity.provider, identity.endpoint_hash
        self.model_id = model_id or identity.model
        self.matrix = matrix
        self.dims = matrix.shape[1]

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        out = []
        for text in texts:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            v = self.matrix[seed % len(self.matrix)] + np.random.default_rng(seed).normal(
                scale=0.05, size=self.dims)
            out.append((v / np.linalg.norm(v)).tolist())
        return out


def cached(db_path: Path) -> tuple[EmbedderIdentity, Any, Any]:
    """The stored identity, and every chunk id of USER with its cached vector (unit rows)."""
    db = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
        identity = EmbedderIdentity.from_json(row[0]) if row else None
        if identity is None:
            raise RuntimeError(f"{db_path} has no embedder identity: build it with vectors first")
        rows = list(db.execute(
            "SELECT c.id, e.vector FROM chunks c JOIN embedding_cache e "
            "ON e.provider = ? AND e.model = ? AND e.endpoint_hash = ? "
            "AND e.content_hash = coalesce(c.vector_hash, c.content_hash) WHERE c.user = ?",
            (identity.provider, identity.model, identity.endpoint_hash, USER)))
    finally:
        db.close()
    ids = np.array([r[0] for r in rows])
    matrix = np.frombuffer(b"".join(bytes(r[1]) for r in rows), np.int8).reshape(
        len(rows), -1).astype(np.float32)
    return identity, ids, matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


async def timed(svc: MemoryService, qs: list[str], label: str, previous: str | None) -> None:
    for mode in ("vector", "hybrid"):
        ms = []
        for q in qs:
            r = await svc.search(USER, q, k=10, mode=mode)
            if r.mode != mode or r.previous_model != previous:
                raise RuntimeError(f"{label} {mode}: ran as {r.mode}, previous "
                                   f"{r.previous_model}: {r.fallback_reason}")
            ms.append(r.timings_ms["searchMs"])
        ms.sort()
        print(f"{label} {mode}: searchMs p50 {statistics.median(ms):.1f}, "
              f"p90 {ms[int(0.9 * len(ms))]:.1f}, "
              f"p99 {ms[int(0.99 * len(ms)) - 1]:.1f} ms (n={len(ms)})", flush=True)


async def measure(data: Path, n: int) -> None:
    identity, ids, matrix = cached(data / "memory.db")
    print(f"{len(ids):,} chunks with cached {identity.model} vectors ({matrix.shape[1]} dims)",
          flush=True)
    qs = queries(n)
    old = CachedVectors(identity, matrix)
    svc = MemoryService(data, bench_memory_config(), old)
    await svc.start(catch_up=False)
    await svc.wait_checked()
    await timed(svc, qs, "normal (its own identity)", None)
    await svc.close()

    new = CachedVectors(identity, matrix, model_id="a-new-model")
    svc = MemoryService(data, bench_memory_config(), new,
                        previous_embedder=lambda _identity: (old, "bench"))
    await svc.start(catch_up=False)
    started = time.perf_counter()
    first = await svc.search(USER, qs[-1], mode="hybrid")
    print(f"first search after start (waits for the previous sign bits' load): "
          f"{(time.perf_counter() - started) * 1000:.0f} ms, "
          f"previousModel {first.previous_model}", flush=True)
    await svc.wait_checked()
    await timed(svc, qs, "interim (previous model)", identity.model)
    hits = 0
    for q in qs:
        qv = np.array((await old.embed([q]))[0], np.float32)
        truth = set(ids[np.argsort(-(matrix @ qv))[:10]].tolist())
        got = {h.chunk_id for h in (await svc.search(USER, q, k=10, mode="vector")).results}
        hits += len(truth & got)
    print("interim vector recall@10 against an exact scan of the cached vectors: "
          f"{hits / (10 * len(qs)):.3f}")
    await svc.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m research.interim",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000,
                        help="corpus size (a make bench-scale corpus)")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    from bench.scale import structlog_quiet
    from bench.scalecorpus import build

    structlog_quiet()

    corpus = build(args.size, log=lambda line: print(line, flush=True))
    with tempfile.TemporaryDirectory(prefix="recalld-interim-") as tmp:
        # A copy: opening with a new identity records the change in the database.
        for part in corpus.data_dir.glob("memory.db*"):
            if ".corrupt-" not in part.name:
                shutil.copy2(part, Path(tmp) / part.name)
        asyncio.run(measure(Path(tmp), args.queries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
