"""The search half of ``make bench-cluster``: one scale corpus on both backends, and recall@10.

The SQLite side is :mod:`bench.scale`'s own measurement of a cached corpus (a fresh child
process; library ``searchMs`` per mode). The PostgreSQL side loads the same transcripts into
the sessions' tables (``COPY`` through :mod:`sessions.pg.bulk`: the rows
``PgSessionStore.append_message`` writes), seeds the shared embedding cache with the SQLite
corpus's vectors (the same synthetic vectors, keyed the same way), lets ``PgMemory``'s own
indexer chunk, fill and build the HNSW index, then measures ``PgMemory.search`` in a child
process the same way. Recall@10 runs ``bench/recall.py`` on ``bench/data/sample.json`` per
backend and granularity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.corpus import USER, bench_memory_config, queries
from bench.stats import summary_ms

__all__ = ["index_postgres", "load_transcripts", "measure_postgres", "recall_runs",
           "sqlite_keyword_build"]

MODES = ("keyword", "vector", "hybrid")
ROOT = Path(__file__).resolve().parent.parent


def load_transcripts(data_dir: Path, dsn: str) -> dict[str, float]:
    """Every transcript of ``data_dir`` as session and message rows; counts and seconds."""
    import psycopg

    from sessions import sessions_root
    from sessions.pg.bulk import MessageRow, SessionRow, copy_messages, copy_sessions
    from sessions.pg.schema import migrate

    started = time.perf_counter()
    files = sorted((sessions_root(data_dir) / USER).glob("*.jsonl"))
    parsed = []
    for path in files:
        lines = path.read_bytes().splitlines()
        parsed.append((orjson.loads(lines[0]), lines[1:]))
    sessions = [SessionRow(header["sessionKey"], header["user"], header.get("title") or "",
                           header["createdAt"],
                           # The store counts a line with its newline, as the file store does.
                           orjson.loads(lines[-1])["ts"] if lines else header["createdAt"],
                           len(lines), sum(len(x) + 1 for x in lines), len(lines))
                for header, lines in parsed]
    messages = (MessageRow(header["sessionKey"], seq, m["id"], m["role"], m["content"], m["ts"],
                           m.get("runId"), m.get("name"), len(raw) + 1)
                for header, lines in parsed for seq, raw in enumerate(lines)
                for m in (orjson.loads(raw),))
    with psycopg.connect(dsn) as conn:
        migrate(conn)
        copy_sessions(conn, sessions)  # first: messages reference them
        copy_messages(conn, messages)
        conn.commit()
    n_messages = sum(len(lines) for _, lines in parsed)
    return {"sessions": len(files), "messages": n_messages, "loadS": time.perf_counter() - started}


async def index_postgres(data_dir: Path, dsn: str) -> dict[str, Any]:
    """PgMemory's indexer over the loaded rows, the cache seeded from the SQLite corpus."""
    import psycopg

    from bench.recall_pg import seed_cache
    from bench.scalecorpus import embedder as make_embedder
    from memory.pg.migrations import migrate
    from memory.pg.service import PgMemory

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
    seeded = seed_cache(dsn, data_dir / "memory.db")
    keyword = await _keyword_only_postgres(dsn)
    started = time.perf_counter()
    service = await PgMemory.open(dsn, bench_memory_config(), make_embedder(),  # type: ignore[arg-type]
                                  data_dir=Path(tempfile.gettempdir()),
                                  embedder_reason="bench: synthetic", poll_s=3600.0)
    try:
        report = await service.sync_now()
        status = await service.status()
    finally:
        await service.close()
    return {"indexS": time.perf_counter() - started, "chunks": int(status["chunks"]),
            "pending": int(status["pending"]), "cacheSeeded": seeded, "error": report.error,
            **keyword}


async def _keyword_only_postgres(dsn: str) -> dict[str, Any]:
    """The keyword index alone, timed as SQLite's ``keyword_s`` is: chunks and postings, no
    embedder (the pass that follows fills the vectors and builds the HNSW index)."""
    from psycopg_pool import AsyncConnectionPool

    from memory.pg.indexer import PgIndexer

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
    await pool.open()
    try:
        started = time.perf_counter()
        report = await PgIndexer(pool, bench_memory_config(), None).run_once()
        seconds = time.perf_counter() - started
    finally:
        await pool.close()
    return {"keywordS": seconds, "keywordChunks": report.chunks_written}


def sqlite_keyword_build(data_dir: Path) -> dict[str, Any]:
    """SQLite's keyword-only index of the same transcripts, rebuilt now in a scratch copy, so
    both backends' build rates come from one run on one machine load."""
    import shutil

    from sessions import sessions_root

    with tempfile.TemporaryDirectory(prefix="recalld-sqlite-build-") as tmp:
        scratch = Path(tmp)
        shutil.copytree(sessions_root(data_dir), sessions_root(scratch))
        for name in ("sessions.db", "sessions.clean"):
            if (data_dir / name).exists():
                shutil.copy2(data_dir / name, scratch / name)
        chunks, seconds = asyncio.run(_index_keyword_only(scratch))
    return {"keywordS": seconds, "keywordChunks": chunks}


async def _index_keyword_only(data_dir: Path) -> tuple[int, float]:
    """``bench.corpus.index_corpus``'s first, timed phase: the real indexer with no embedder."""
    from memory.sqlite.index.db import WriteConnection, open_index
    from memory.sqlite.index.indexing import Indexer
    from sessions import sessions_root

    opened = open_index(data_dir / "memory.db")
    conn = WriteConnection(opened.db)
    try:
        indexer = Indexer.on(conn, opened.vectors, sessions_root(data_dir), bench_memory_config())
        started = time.perf_counter()
        report = await indexer.sync(None)
        return report.chunks_written, time.perf_counter() - started
    finally:
        conn.close()


async def _measure_pg(dsn: str, n_queries: int) -> dict[str, Any]:
    """In the child: restart to first hybrid search, then every query in each mode, twice."""
    from bench.scalecorpus import embedder as make_embedder
    from memory.pg.service import PgMemory

    qs = queries(n_queries)
    started = time.perf_counter()
    service = await PgMemory.open(dsn, bench_memory_config(), make_embedder(),  # type: ignore[arg-type]
                                  data_dir=Path(tempfile.gettempdir()),
                                  embedder_reason="bench: synthetic", poll_s=3600.0)
    try:
        first = await service.search(USER, qs[0], mode="hybrid")
        restart_ms = (time.perf_counter() - started) * 1000
        lib: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(2):
            for q in qs:
                for m in MODES:
                    r = await service.search(USER, q, k=6, mode=m)
                    if r.mode != m:
                        raise RuntimeError(f"{m} ran as {r.mode}: {r.fallback_reason}")
                    lib[m].append(r.timings_ms["searchMs"] / 1000)
        got = [[(h.session_key, h.line_start)
                for h in (await service.search(USER, q, k=10, mode="vector")).results]
               for q in qs]
        try:
            plan = await _explain_hybrid(service, qs[1])
        except Exception as exc:  # noqa: BLE001 - the plan is a note beside the figures, never a reason to lose them
            plan = [f"EXPLAIN failed: {type(exc).__name__}: {exc}"]
    finally:
        await service.close()
    return {"restart": {"ms": restart_ms, "mode": first.mode},
            "library": {m: summary_ms(v) for m, v in lib.items()},
            "vectorHits": got, "hybridPlan": plan}


async def _explain_hybrid(service: Any, query: str) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the hybrid statement as ``PgSearch`` runs it for ``query``."""
    from psycopg import IsolationLevel

    from memory.pg.search import _halfvec, build_statement, set_hnsw_search, statement_params
    from memory.pg.vectors import vector_dims
    from memory.retrieval.request import SearchRequest, fts_terms

    config = service.config
    request = SearchRequest.build(config, USER, query, k=6, mode="hybrid")
    vector = await service.embed_query(request.query)
    words = [t[1:-1].replace('""', '"') for t in fts_terms(request.query, config.max_query_terms)]
    async with service.pool.connection() as conn:
        await conn.set_isolation_level(IsolationLevel.REPEATABLE_READ)
        async with conn.transaction():
            await set_hnsw_search(conn, config)
            dims = await vector_dims(conn)
            sql = build_statement(request, keyword=bool(words), dims=dims, leg="hnsw")
            params = statement_params(config, request, words, _halfvec(vector))
            rows = await (await conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + sql.encode(),
                                             params)).fetchall()
        await conn.set_isolation_level(None)
    return [str(r[0]) for r in rows]


def _sqlite_keys(data_dir: Path) -> dict[int, tuple[str, int]]:
    """SQLite chunk id → (session key, first line): how a chunk is named on both backends."""
    import apsw

    db = apsw.Connection(str(data_dir / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {int(i): (str(key), int(line))
                for i, key, line in db.execute("SELECT id, session_key, line_start FROM chunks")}
    finally:
        db.close()


def measure_postgres(data_dir: Path, dsn: str, n_queries: int) -> dict[str, Any]:
    """The PostgreSQL figures in a fresh child process, and vector recall@10 against the exact
    float scan of the SQLite corpus (chunks matched by session and first line)."""
    proc = subprocess.run([sys.executable, "-m", "bench.clustersearch", "--child-pg", dsn,
                           "--queries", str(n_queries)],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring PostgreSQL failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    hits = out.pop("vectorHits")
    try:
        from bench.scale import exact_truth
        from bench.scalecorpus import embedder as make_embedder

        truth = exact_truth(data_dir, make_embedder(), queries(n_queries))
        names = _sqlite_keys(data_dir)
        out["recall10"] = sum(len({tuple(h) for h in got} & {names[i] for i in want}) / 10
                              for got, want in zip(hits, truth)) / len(truth)
    except Exception as exc:  # noqa: BLE001 - the recall is a figure beside the latencies, not a gate
        out["recall10Error"] = f"{type(exc).__name__}: {exc}"
    return out


def recall_runs(dsn: str, out_dir: Path, *, embedder: str = "local") -> dict[str, Any]:
    """bench/recall.py on sample.json: both granularities on both backends, one vector cache."""
    cache = ROOT / "bench" / ".cache" / "recall-embeddings.sqlite"
    results: dict[str, Any] = {}
    for granularity in ("chunk", "turn"):
        for backend in ("sqlite", "postgres"):
            target = out_dir / f"recall-{backend}-{granularity}.json"
            cmd = [sys.executable, "bench/recall.py", "bench/data/sample.json",
                   "--embedder", embedder, "--granularity", granularity,
                   "--embedding-cache", str(cache), "--json", str(target)]
            if backend == "postgres":
                cmd += ["--backend", "postgres", "--dsn", dsn]
            started = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
            if proc.returncode != 0:
                raise RuntimeError(f"recall {backend} {granularity} failed:\n{proc.stderr[-3000:]}")
            report = json.loads(target.read_text())
            results[f"{backend}/{granularity}"] = {
                "seconds": time.perf_counter() - started, "embedder": report.get("embedder"),
                **{m: report["modes"][m]["overall"]["recall@10"] for m in MODES}}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clustersearch")
    parser.add_argument("--child-pg", required=True, metavar="DSN")
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    from bench.scale import structlog_quiet

    structlog_quiet()
    print(json.dumps(asyncio.run(_measure_pg(args.child_pg, args.queries))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
