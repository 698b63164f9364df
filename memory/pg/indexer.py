"""Indexing as shared work: the sessions' messages on PostgreSQL become chunks, on any node.

What it reads of the sessions' tables comes through :mod:`sessions.pg.feed` (``sessions.pg_feed``),
which owns them; this module names none of them.

One pass (:meth:`PgIndexer.run_once`) does three things, each in short transactions:

1. **Claim and chunk.** Every session with ``memory`` on gets a row in
   ``recalld_memory_progress``. Rows whose session changed since it was chunked (its
   ``updated_at`` or ``message_count`` moved from what the last claim saw, or the chunk
   settings did) are locked with
   ``FOR UPDATE SKIP LOCKED``, so each is indexed by whichever node takes it first and never by
   two at once. The session's messages from its last chunk's first message are re-packed with
   :func:`memory.chunking.chunk_messages` — the same chunks the SQLite path makes from the
   same messages (a message's line is its ``seq + 2``, as in a transcript whose line 1 is the
   header) — and compared by ``chunk_idx``: identical chunks stay, changed or new ones are
   written, surplus ones deleted. Fewer message rows up to the indexed ``seq`` than were
   indexed (a purge) re-chunks the session whole.
2. **Sweep.** Progress rows of sessions that were deleted or are incognito go, with their chunks.
3. **Embed.** Each distinct pending text is embedded once across every node: a node takes
   ``pg_try_advisory_xact_lock(EMBED_LOCK, hashtext(hash))`` for the texts it will embed, looks
   them up in the shared cache again under the lock, embeds only the misses, stores them and
   fills every pending chunk with that text — all in one transaction, so a node that dies
   mid-call releases its locks and another embeds the text on its next pass. Texts locked by
   another node are left to it; the cache fills their chunks on the next pass.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.chunking import Chunk, chunk_messages, fts_text, iso_to_ms, sha256_text, visible_entries
from memory.config import MemoryConfig, SizedConfig
from memory.embedders.embeddings import EmbeddingPipeline
from memory.index.quantize import quantize_int8
from memory.pg.migrations import TS_CONFIG
from memory.pg.vectors import VectorLeg, drop_vector_index, ensure_vector_index
from sessions import REPLACES_KEY, Message, TranscriptEntry, pg_feed

__all__ = ["EMBED_LOCK", "SESSION_STATS_SQL", "IndexReport", "PgIndexer", "chunking_fingerprint", "doc_length"]

# The first key of the two-key advisory lock a node holds on a text while it embeds it.
EMBED_LOCK = 0x72636C64

# FTS5's unicode61 tokens (letter/digit runs); BM25's document length counts these, as FTS5 does.
_TOKENS = re.compile(r"[^\W_]+")


def doc_length(content: str) -> int:
    return len(_TOKENS.findall(fts_text(content)))


def chunking_fingerprint(sizes: SizedConfig) -> str:
    return f"v1:{sizes.chunk_tokens}:{sizes.overlap_tokens}"


@dataclass(slots=True)
class IndexReport:
    sessions: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    embedded: int = 0              # texts sent to the embedder by this node
    filled: int = 0                # chunks given a vector (from the embedder or the cache)
    errors: list[str] = field(default_factory=list)


_SEED_SQL = f"""
INSERT INTO recalld_memory_progress (session_key, user_id)
SELECT s.session_key, s.user_id FROM {pg_feed.MEMORY_SESSIONS} s
WHERE NOT EXISTS (SELECT 1 FROM recalld_memory_progress p WHERE p.session_key = s.session_key)
ON CONFLICT (session_key) DO NOTHING
"""

_GONE_SQL = f"""
DELETE FROM recalld_memory_progress p
WHERE NOT EXISTS (SELECT 1 FROM {pg_feed.MEMORY_SESSIONS} s WHERE s.session_key = p.session_key)
RETURNING p.session_key
"""

# The sessions changed since this package's mark (seen_updated, seen_count), locked on our side only.
_CLAIM_SQL = f"""
SELECT p.session_key, p.user_id, p.indexed_seq, p.indexed_count, p.chunking, s.updated_at, s.message_count
FROM recalld_memory_progress p
JOIN {pg_feed.MEMORY_SESSIONS} s ON s.session_key = p.session_key
WHERE (p.seen_updated <> s.updated_at OR p.seen_count <> s.message_count OR p.chunking <> %(chunking)s)
ORDER BY p.session_key
LIMIT %(limit)s
FOR UPDATE OF p SKIP LOCKED
"""

_UPSERT_CHUNK_SQL = f"""
INSERT INTO recalld_memory_chunks (user_id, session_key, chunk_idx, content, line_start, line_end, seq_start,
  seg_start, start_ts, end_ts, start_ms, end_ms, content_hash, vector_hash, tsv, doc_len)
VALUES (%(user)s, %(session_key)s, %(idx)s, %(content)s, %(line_start)s, %(line_end)s, %(seq_start)s,
  %(seg_start)s, %(start_ts)s, %(end_ts)s, %(start_ms)s, %(end_ms)s, %(content_hash)s, %(vector_hash)s,
  to_tsvector('{TS_CONFIG}', %(fts)s), %(doc_len)s)
ON CONFLICT (session_key, chunk_idx) DO UPDATE SET
  content = excluded.content, line_start = excluded.line_start, line_end = excluded.line_end,
  seq_start = excluded.seq_start, seg_start = excluded.seg_start, start_ts = excluded.start_ts,
  end_ts = excluded.end_ts, start_ms = excluded.start_ms, end_ms = excluded.end_ms,
  content_hash = excluded.content_hash, vector_hash = excluded.vector_hash, tsv = excluded.tsv,
  doc_len = excluded.doc_len, embedding = NULL
"""

_FORGOTTEN_SQL = """
DELETE FROM recalld_memory_chunks c USING recalld_memory_forgotten f
WHERE c.session_key = %(session_key)s AND f.user_id = c.user_id
  AND (f.session_key IS NULL OR f.session_key = c.session_key)
  AND (f.after_ms IS NULL OR coalesce(c.end_ms, c.start_ms) >= f.after_ms)
  AND (f.before_ms IS NULL OR c.start_ms < f.before_ms)
"""

_PROGRESS_SQL = """
UPDATE recalld_memory_progress SET indexed_seq = %(seq)s, indexed_count = %(count)s,
  seen_updated = %(updated)s, seen_count = %(seen_count)s, chunking = %(chunking)s, indexed_at = now()
WHERE session_key = %(session_key)s
"""

# The session's share of BM25's corpus statistics, after any change to its chunks.
SESSION_STATS_SQL = """
UPDATE recalld_memory_progress p SET (n_chunks, total_len) = (
  SELECT count(*), coalesce(sum(c.doc_len), 0) FROM recalld_memory_chunks c WHERE c.session_key = p.session_key)
WHERE p.session_key = ANY(%s)
"""

# Each node walks the pending texts in its own (salted) order, so two nodes start on different
# texts instead of both waiting on the locks of the same first batch.
_PENDING_SQL = """
SELECT vector_hash, content FROM (
  SELECT DISTINCT ON (vector_hash) vector_hash, content FROM recalld_memory_chunks
  WHERE embedding IS NULL ORDER BY vector_hash) AS pending
ORDER BY md5(vector_hash || %s) LIMIT %s
"""

# Chunks whose text is in the cache get its vector; int8 bytes become a halfvec of the same
# integers, so cosine over it is SQLite's int8 cosine exactly.
_FILL_SQL = """
UPDATE recalld_memory_chunks c
SET embedding = recalld_memory_int8_halfvec(e.vector)
FROM recalld_memory_embedding_cache e
WHERE c.embedding IS NULL AND c.vector_hash = ANY(%(hashes)s)
  AND e.provider = %(provider)s AND e.model = %(model)s AND e.endpoint_hash = %(endpoint_hash)s
  AND e.content_hash = c.vector_hash
"""


class PgIndexer:
    """One node's share of the indexing; every method is a coroutine on a connection pool."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[TupleRow]], config: MemoryConfig,
                 pipeline: EmbeddingPipeline | None, *, sessions_per_claim: int = 8,
                 texts_per_pass: int = 256, vector_leg: VectorLeg = "hnsw") -> None:
        self.pool = pool
        self.vector_leg: VectorLeg = vector_leg
        self.config = config
        self.pipeline = pipeline
        window = pipeline.embedder.max_tokens if pipeline is not None else None
        self.sizes = config.sized_for(window)
        self.chunking = chunking_fingerprint(self.sizes)
        self.sessions_per_claim = sessions_per_claim
        self.texts_per_pass = texts_per_pass
        self._salt = secrets.token_hex(8)

    @property
    def identity(self) -> tuple[str, str, str] | None:
        if self.pipeline is None:
            return None
        e = self.pipeline.embedder
        return e.provider, e.model_id, e.endpoint_hash

    async def run_once(self) -> IndexReport:
        """Chunk every changed session this node can claim, sweep, then embed what is pending."""
        report = IndexReport()
        await self._ensure_identity()
        async with self.pool.connection() as conn:
            if not await pg_feed.ready(conn):
                return report
            await conn.execute(_SEED_SQL)
            await conn.commit()
            await self._sweep(conn, report)
            while await self._claim_and_chunk(conn, report):
                pass
        while self.pipeline is not None and await self._embed_some(report):
            pass
        if self.pipeline is not None:
            async with self.pool.connection() as conn:
                await ensure_vector_index(conn, self.vector_leg)
        return report

    async def pending(self) -> int:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT count(*) FROM recalld_memory_chunks WHERE embedding IS NULL")).fetchone()
            return int(row[0]) if row else 0

    # --- chunks -------------------------------------------------------------------------

    async def _sweep(self, conn: AsyncConnection[TupleRow], report: IndexReport) -> None:
        async with conn.transaction():
            gone = [str(k) for (k,) in await (await conn.execute(_GONE_SQL)).fetchall()]
            if gone:
                cur = await conn.execute("DELETE FROM recalld_memory_chunks WHERE session_key = ANY(%s)", (gone,))
                report.chunks_deleted += cur.rowcount

    async def _claim_and_chunk(self, conn: AsyncConnection[TupleRow], report: IndexReport) -> bool:
        async with conn.transaction():
            claimed = await (await conn.execute(
                _CLAIM_SQL, {"chunking": self.chunking, "limit": self.sessions_per_claim})).fetchall()
            for key, user, indexed_seq, indexed_count, chunking, updated, seen_count in claimed:
                await self._chunk_session(conn, str(key), str(user), int(indexed_seq), int(indexed_count),
                                          str(chunking), (str(updated), int(seen_count)), report)
        return bool(claimed)

    async def _chunk_session(self, conn: AsyncConnection[TupleRow], key: str, user: str, indexed_seq: int,
                             indexed_count: int, chunking: str, seen: tuple[str, int], report: IndexReport) -> None:
        """Re-chunk one claimed session; ``seen`` is its (updated_at, message_count) at the
        claim, recorded so the session is claimed again only when they move (never in a loop
        when a count disagrees with the rows)."""
        still = await pg_feed.count_through(conn, key, indexed_seq)
        whole = chunking != self.chunking or still != indexed_count
        last = None if whole else await (await conn.execute(
            "SELECT chunk_idx, seq_start, seg_start FROM recalld_memory_chunks WHERE session_key = %s "
            "ORDER BY chunk_idx DESC LIMIT 1", (key,))).fetchone()
        if whole:
            cur = await conn.execute("DELETE FROM recalld_memory_chunks WHERE session_key = %s", (key,))
            report.chunks_deleted += cur.rowcount
        first_idx, start_seq, skip = (0, 0, 0) if last is None else (int(last[0]), int(last[1]), int(last[2]))
        rows = await pg_feed.messages_from(conn, key, start_seq)
        entries, rewind = visible_entries(_entries(rows), new_from=indexed_seq + 1)
        if rewind and start_seq > 0:
            # A new edit or regenerate (see the SQLite indexer): re-cut the session from its
            # first message; unchanged chunks stay.
            first_idx, start_seq, skip = 0, 0, 0
            rows = await pg_feed.messages_from(conn, key, 0)
            entries, _ = visible_entries(_entries(rows), new_from=0)
        chunks = chunk_messages(entries, self.sizes.chunk_tokens, self.sizes.overlap_tokens,
                                first_idx=first_idx, skip_segments=skip)
        await self._write_chunks(conn, key, user, first_idx, chunks, report)
        top = int(rows[-1].seq) if rows else indexed_seq
        count = await pg_feed.count_through(conn, key, top)
        await conn.execute(_PROGRESS_SQL, {"seq": top, "count": count, "updated": seen[0],
                                           "seen_count": seen[1], "chunking": self.chunking, "session_key": key})
        await conn.execute(SESSION_STATS_SQL, ([key],))
        report.sessions += 1

    async def _write_chunks(self, conn: AsyncConnection[TupleRow], key: str, user: str, first_idx: int,
                            chunks: Sequence[Chunk], report: IndexReport) -> None:
        stored: dict[int, str] = dict(await (await conn.execute(
            "SELECT chunk_idx, content_hash FROM recalld_memory_chunks WHERE session_key = %s AND chunk_idx >= %s",
            (key, first_idx))).fetchall())
        fresh = [c for c in chunks if stored.get(c.idx) != c.content_hash]
        if fresh:
            async with conn.cursor() as cur:
                await cur.executemany(_UPSERT_CHUNK_SQL, [self._row(user, key, c) for c in fresh])
            report.chunks_written += len(fresh)
        surplus = [idx for idx in stored if idx >= first_idx + len(chunks)]
        if surplus:
            cur = await conn.execute(
                "DELETE FROM recalld_memory_chunks WHERE session_key = %s AND chunk_idx = ANY(%s)", (key, surplus))
            report.chunks_deleted += cur.rowcount
        await conn.execute(_FORGOTTEN_SQL, {"session_key": key})

    def _row(self, user: str, key: str, c: Chunk) -> dict[str, Any]:
        sent = self.pipeline.text_to_send(c.content) if self.pipeline is not None else c.content
        return {
            "user": user, "session_key": key, "idx": c.idx, "content": c.content, "line_start": c.line_start,
            "line_end": c.line_end, "seq_start": c.byte_start, "seg_start": c.seg_start,
            "start_ts": c.start_ts, "end_ts": c.end_ts, "start_ms": iso_to_ms(c.start_ts),
            "end_ms": iso_to_ms(c.end_ts), "content_hash": c.content_hash,
            "vector_hash": c.content_hash if sent == c.content else sha256_text(sent),
            "fts": fts_text(c.content), "doc_len": doc_length(c.content),
        }

    # --- vectors ------------------------------------------------------------------------

    async def _ensure_identity(self) -> None:
        """A new embedder identity empties every chunk's vector; the cache refills what it can."""
        identity = json.dumps(list(self.identity)) if self.identity is not None else ""
        async with self.pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(
                "SELECT value FROM recalld_memory_meta WHERE key = 'embedder' FOR UPDATE")).fetchone()
            if row is not None and row[0] == identity:
                return
            await conn.execute("UPDATE recalld_memory_chunks SET embedding = NULL WHERE embedding IS NOT NULL")
            await drop_vector_index(conn)
            await conn.execute("INSERT INTO recalld_memory_meta(key, value) VALUES ('embedder', %s) "
                               "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (identity,))

    async def _embed_some(self, report: IndexReport) -> bool:
        """One batch of distinct pending texts; False when it filled no chunk (nothing pending, or
        every pending text is another node's to embed right now)."""
        assert self.pipeline is not None and self.identity is not None
        provider, model, endpoint = self.identity
        params = {"provider": provider, "model": model, "endpoint_hash": endpoint}
        async with self.pool.connection() as conn, conn.transaction():
            pending = await (await conn.execute(_PENDING_SQL, (self._salt, self.texts_per_pass))).fetchall()
            if not pending:
                return False
            hashes = [str(h) for h, _ in pending]
            # First what the cache already holds (another node's work, or another session's text).
            before = report.filled
            cur = await conn.execute(_FILL_SQL, {**params, "hashes": hashes})
            report.filled += cur.rowcount
            locked = await (await conn.execute(
                "SELECT h FROM unnest(%s::text[]) AS h WHERE pg_try_advisory_xact_lock(%s, hashtext(h))",
                (hashes, EMBED_LOCK))).fetchall()
            mine = {str(h) for (h,) in locked}
            cached = {str(h) for (h,) in await (await conn.execute(
                "SELECT content_hash FROM recalld_memory_embedding_cache WHERE provider = %(provider)s "
                "AND model = %(model)s AND endpoint_hash = %(endpoint_hash)s AND content_hash = ANY(%(hashes)s)",
                {**params, "hashes": list(mine)})).fetchall()}
            texts = {str(h): self.pipeline.text_to_send(str(content)) for h, content in pending
                     if str(h) in mine and str(h) not in cached}
            if texts:
                await self._embed_into_cache(conn, texts, params, report)
            cur = await conn.execute(_FILL_SQL, {**params, "hashes": list(mine)})
            report.filled += cur.rowcount
            return report.filled > before

    async def _embed_into_cache(self, conn: AsyncConnection[TupleRow], texts: dict[str, str],
                                params: dict[str, str], report: IndexReport) -> None:
        assert self.pipeline is not None
        order = list(texts)
        vectors: list[list[float]] = []
        for batch in self.pipeline.batches([texts[h] for h in order]):
            vectors.extend(await self.pipeline.embed_batch(batch))
        report.embedded += len(order)
        rows = [{**params, "content_hash": h, "dims": len(v), "vector": quantize_int8(v)}
                for h, v in zip(order, vectors, strict=True)]
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO recalld_memory_embedding_cache (provider, model, endpoint_hash, content_hash, dims, "
                "vector) VALUES (%(provider)s, %(model)s, %(endpoint_hash)s, %(content_hash)s, %(dims)s, "
                "%(vector)s) ON CONFLICT DO NOTHING", rows)


def _entries(rows: Sequence[pg_feed.FeedMessage]) -> list[TranscriptEntry]:
    """Message rows as the chunker reads a transcript: a message's line is its ``seq + 2`` and
    its offset its ``seq``; only ``replaces`` of the line's other keys matters to indexing."""
    return [TranscriptEntry(int(seq) + 2, int(seq), Message(
                str(mid), str(role), str(content), str(ts), run_id, name,
                {REPLACES_KEY: replaces} if isinstance(replaces, str) else {}))
            for seq, mid, role, content, ts, run_id, name, replaces in rows]
