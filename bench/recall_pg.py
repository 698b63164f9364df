"""``bench/recall.py --backend postgres --dsn DSN``: the same questions against the PostgreSQL
index.

The dataset is written into the sessions' tables by the sessions store
(``sessions.PgSessionStore``): the same sessions, keys, dates,
speakers and order as ``load_corpus`` writes to JSONL, so message ``i`` of a transcript is line
``i + 2`` here too), indexed by ``memory.pg``'s indexer and asked through ``PgMemory.search``
by recall.py's own ``_ask``. The run uses a scratch database created on the DSN's server and
dropped afterwards. ``--embedding-cache FILE`` (a file a SQLite run kept) seeds the shared
cache, so both backends rank the very same vectors.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import psycopg
from psycopg.conninfo import make_conninfo

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, select_embedder
from memory.pg.migrations import migrate
from memory.pg.service import PgMemory
from memory.pg.vectors import VectorLeg
from sessions import PgSessionStore, format_ts

if TYPE_CHECKING:
    from bench.recall import Dataset, LoadedCorpus, RunResult

__all__ = ["run_postgres_benchmark", "scratch_database"]


@contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """A new empty database on ``dsn``'s server (dropped on exit); its DSN."""
    name = f"recalld_recall_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def load_into_postgres(dataset: Dataset, dsn: str, granularity: str, *,
                       seed: int = 0) -> LoadedCorpus:
    """recall.load_corpus's layout, written into the sessions tables."""
    from bench.recall import TURN_STEP, LoadedCorpus, _roles, _seeded_session_keys, user_name

    corpus = LoadedCorpus()
    next_key = _seeded_session_keys(seed)
    with PgSessionStore(dsn, pool_size=1, key_factory=next_key) as store:
        for ci, conv in enumerate(dataset.conversations):
            user = user_name(ci, conv.id)
            corpus.users[conv.id] = user
            roles = _roles(conv)
            for sess in conv.sessions:
                groups = ([list(enumerate(sess.turns))] if granularity == "chunk"
                          else [[(i, t)] for i, t in enumerate(sess.turns)])
                for group in groups:
                    key = store.create(
                        user, title=f"{conv.id} / {sess.id}",
                        created_at=format_ts(sess.date + TURN_STEP * group[0][0])).session_key
                    # the store's seq: 0, 1, 2… in append order
                    for seq, (i, turn) in enumerate(group):
                        store.append_message(user, key, role=roles[turn.speaker], content=turn.text,
                                             name=turn.speaker,
                                             ts=format_ts(sess.date + TURN_STEP * i))
                        corpus.line_map[(key, seq + 2)] = turn.id
                        corpus.turns += 1
                    corpus.transcripts += 1
    return corpus


def seed_cache(dsn: str, cache_file: Path) -> int:
    """Copy a SQLite run's embedding cache into the shared PostgreSQL cache."""
    import apsw

    db = apsw.Connection(str(cache_file), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = list(db.execute("SELECT provider, model, endpoint_hash, content_hash, dims, vector "
                               "FROM embedding_cache"))
    finally:
        db.close()
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO recalld_memory_embedding_cache (provider, model, "
                        "endpoint_hash, content_hash, dims, vector) "
                        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", rows)
    return len(rows)


async def run_postgres_benchmark(dataset: Dataset, *, dsn: str, dataset_name: str,
                                 embedder_name: str, granularity: str, k: int, rrf_k: int,
                                 candidates: int, base_config: MemoryConfig | None,
                                 embedder: Embedder | None = None,
                                 embedding_cache: Path | None = None, as_of: bool = False,
                                 vector_leg: VectorLeg = "hnsw",
                                 progress_stream: TextIO | None = None) -> RunResult:
    from bench.recall import _ask, _Progress, longest_turn_tokens, memory_config

    progress = _Progress(progress_stream)
    config = memory_config(granularity, embedder=embedder_name, k=k, rrf_k=rrf_k,
                           candidates=candidates, max_turn_tokens=longest_turn_tokens(dataset),
                           base=base_config)
    reason = "embedder passed in by the caller"
    if embedder is None:
        embedder, reason = select_embedder(config)
        if embedder is None and embedder_name != "none":
            raise RuntimeError(f"embedder {embedder_name!r} is not available: {reason}")
    seconds: dict[str, float] = {}
    with scratch_database(dsn) as run_dsn:
        with psycopg.connect(run_dsn, autocommit=True) as conn:
            migrate(conn)
        if embedding_cache is not None and embedding_cache.exists():
            seed_cache(run_dsn, embedding_cache)
        started = time.perf_counter()
        corpus = await asyncio.to_thread(load_into_postgres, dataset, run_dsn, granularity)
        seconds["load"] = time.perf_counter() - started
        service = await PgMemory.open(run_dsn, config, embedder,
                                      data_dir=Path(tempfile.gettempdir()), embedder_reason=reason,
                                      vector_leg=vector_leg)
        # One claimer: chunk ids then follow the sessions' order, as SQLite's follow its sync's.
        # Both legs break equal scores by chunk id, and the tests' bag-of-words embedder gives many
        # equal scores, so with two claimers racing for batches R@10 moved by a question from run
        # to run (0.515-0.533 in vector mode on the sample) and the figures could not be compared.
        service.indexer.claim_workers = 1
        try:
            started = time.perf_counter()
            report = await service.sync_now()
            status = await service.status()
            if embedder is not None and status["pending"]:
                raise RuntimeError(f"indexing left {status['pending']} chunks without vectors: "
                                   f"{report.error}")
            seconds["index"] = time.perf_counter() - started
            started = time.perf_counter()
            result = await _ask(service, dataset, corpus, k, as_of, progress,  # type: ignore[arg-type]
                                dataset_name=dataset_name, embedder_name=embedder_name,
                                granularity=granularity)
            result.seconds.update(seconds, search=time.perf_counter() - started)
        finally:
            await service.close()
    result.chunks, result.embedder_reason = int(status["chunks"]), reason
    result.report["backend"] = f"postgres ({vector_leg})"
    return result
