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
   indexed (a purge) re-chunks the session whole. A claim takes ``sessions_per_claim``
   sessions; each is read and cut on its own, then the batch is written in one transaction of
   a few multi-row statements (chunks as one JSON array of rows, read by ``json_to_recordset``;
   their lexemes by ``to_tsvector`` in the same statement, their postings by one
   statement-level trigger, m003). A pass whose first claim is a full batch starts
   ``claim_workers − 1`` more claimers on connections of their own, as another node would:
   while one waits on PostgreSQL's writes, another reads and cuts its sessions, and the
   server's work runs in one backend per claimer.
2. **Sweep.** Progress rows of sessions that were deleted or are incognito go, with their chunks.
3. **Embed.** Each distinct pending text is embedded once across every node: a node takes
   ``pg_try_advisory_xact_lock(EMBED_LOCK, hashtext(hash))`` for the texts it will embed, looks
   them up in the shared cache again under the lock, embeds only the misses, stores them and
   fills every pending chunk with that text — all in one transaction, so a node that dies
   mid-call releases its locks and another embeds the text on its next pass. Texts locked by
   another node are left to it; the cache fills their chunks on the next pass.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from psycopg import AsyncConnection
from psycopg.errors import DeadlockDetected, LockNotAvailable, QueryCanceled
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.chunking import Chunk, chunk_messages, fts_text, iso_to_ms, sha256_text, visible_entries
from memory.config import MemoryConfig, SizedConfig
from memory.embedders.embeddings import EmbeddingPipeline
from memory.embedders.previous import EmbedderIdentity
from memory.errors import EmbedderError
from memory.forget_range import retention_cutoff_ms
from memory.pg.migrations import TS_CONFIG
from memory.pg.vectors import (
    FILL_SQL,
    PENDING_SQL,
    VectorLeg,
    end_rebuild,
    ensure_vector_index,
    fill_previous,
    holds_identity,
    record_first,
    start_rebuild,
    store_in_cache,
)
from sessions import REPLACES_KEY, Message, TranscriptEntry, pg_feed

__all__ = ["CHUNKS_PER_STATEMENT", "CLAIM_WORKERS", "EMBED_LOCK", "SESSIONS_PER_CLAIM",
           "SESSION_STATS_SQL", "IndexReport", "PgIndexer", "chunking_fingerprint", "doc_length"]

log = structlog.get_logger("memory.pg")

# Sessions one claim locks and indexes in one transaction. Bigger batches cost fewer statements
# per chunk; the locks are held until the batch commits (another node skips those sessions, it
# never waits on them), and a failed batch is retried whole at the next pass.
SESSIONS_PER_CLAIM = 64
# Chunks per multi-row INSERT (a statement's JSON stays a few MB at 400-token chunks).
CHUNKS_PER_STATEMENT = 1000
# Claimers of one pass, each on its own pooled connection (never more than the pool holds). Of a
# bulk build's CPU about four fifths is PostgreSQL's (to_tsvector, then ~110 postings a chunk,
# their btree and WAL) and one fifth this process's (reading and cutting messages); two claimers
# overlap the two and give the server's part a backend each. The others start only once a claim
# comes back full (a pass over a few appends uses one connection, as before).
CLAIM_WORKERS = 2
# Batches of one pass aborted as deadlocks and claimed again before the pass gives up (the next
# pass starts over): each deadlock lets the other transaction commit, so a retry progresses.
_DEADLOCK_RETRIES = 8
# The postings trigger sorts a statement's postings (~110 a chunk at 400 tokens: ~10 MB for a
# statement of 1,000 chunks); with PostgreSQL's default 4 MB that sort spilled to disk. Set for
# the batch's transaction only.
_BATCH_WORK_MEM = "32MB"

# The first key of the two-key advisory lock a node holds on a text while it embeds it.
EMBED_LOCK = 0x72636C64

# FTS5's unicode61 tokens (letter/digit runs); BM25's document length counts these, as FTS5 does.
_TOKENS = re.compile(r"[^\W_]+")


def doc_length(content: str) -> int:
    return _token_count(fts_text(content))


def _token_count(fts: str) -> int:
    # subn counts the matches without a list of their strings (a quarter faster than findall).
    return _TOKENS.subn("", fts)[1]


def chunking_fingerprint(sizes: SizedConfig) -> str:
    return f"v1:{sizes.chunk_tokens}:{sizes.overlap_tokens}"


@dataclass(slots=True)
class IndexReport:
    sessions: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    sessions_deleted: int = 0      # progress rows swept: their session was deleted or went
                                   # incognito
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

# The sessions changed since this package's mark (seen_updated, seen_count), locked on our side
# only.
_CLAIM_SQL = f"""
SELECT p.session_key, p.user_id, p.indexed_seq, p.indexed_count, p.chunking, s.updated_at,
  s.message_count
FROM recalld_memory_progress p
JOIN {pg_feed.MEMORY_SESSIONS} s ON s.session_key = p.session_key
WHERE (p.seen_updated <> s.updated_at OR p.seen_count <> s.message_count
  OR p.chunking <> %(chunking)s)
ORDER BY p.session_key
LIMIT %(limit)s
FOR UPDATE OF p SKIP LOCKED
"""

# A batch's chunks in one statement: one JSON array of row objects, read in the batch's order (so
# a statement's ids are handed out as a row-by-row insert would: by session key, then chunk index;
# with several claimers, batches take ids in the order they are written). ``fts`` is NULL where
# it is the content itself (no CJK to space out), so a text is sent once. Passing the rows as
# JSON (orjson here, ``json_to_recordset`` there) costs a fifth of one typed array per column:
# psycopg's array dumper walks every element in Python and array_in parses each array again.
_CHUNK_COLUMNS = ("user_id", "session_key", "chunk_idx", "content", "line_start", "line_end",
                  "seq_start", "seg_start", "start_ts", "end_ts", "start_ms", "end_ms",
                  "content_hash", "vector_hash", "fts", "doc_len")
_CHUNK_TYPES = ("text", "text", "int4", "text", "int4", "int4",
                "int8", "int4", "text", "text", "int8", "int8",
                "text", "text", "text", "int4")
_UPSERT_CHUNKS_SQL = f"""
INSERT INTO recalld_memory_chunks (user_id, session_key, chunk_idx, content, line_start, line_end,
  seq_start, seg_start, start_ts, end_ts, start_ms, end_ms, content_hash, vector_hash, tsv, doc_len)
SELECT user_id, session_key, chunk_idx, content, line_start, line_end, seq_start, seg_start,
  start_ts, end_ts, start_ms, end_ms, content_hash, vector_hash,
  to_tsvector('{TS_CONFIG}', coalesce(fts, content)), doc_len
FROM json_to_recordset(%s::json) AS r({
    ", ".join(f"{c} {t}" for c, t in zip(_CHUNK_COLUMNS, _CHUNK_TYPES, strict=True))})
ON CONFLICT (session_key, chunk_idx) DO UPDATE SET
  content = excluded.content, line_start = excluded.line_start, line_end = excluded.line_end,
  seq_start = excluded.seq_start, seg_start = excluded.seg_start, start_ts = excluded.start_ts,
  end_ts = excluded.end_ts, start_ms = excluded.start_ms, end_ms = excluded.end_ms,
  content_hash = excluded.content_hash, vector_hash = excluded.vector_hash, tsv = excluded.tsv,
  doc_len = excluded.doc_len, embedding = NULL, embedding_previous = NULL
"""

# Each claimed session's last chunk (where an append resumes), in one look-up for the batch.
_LAST_CHUNKS_SQL = """
SELECT DISTINCT ON (session_key) session_key, chunk_idx, seq_start, seg_start
FROM recalld_memory_chunks
WHERE session_key = ANY(%s) ORDER BY session_key, chunk_idx DESC
"""

# The stored hashes from each session's first re-cut chunk on.
_STORED_SQL = """
SELECT c.session_key, c.chunk_idx, c.content_hash
FROM recalld_memory_chunks c JOIN unnest(%s::text[], %s::int4[]) AS f(session_key, first_idx)
  ON c.session_key = f.session_key AND c.chunk_idx >= f.first_idx
"""

_SURPLUS_SQL = """
DELETE FROM recalld_memory_chunks c
USING unnest(%s::text[], %s::int4[]) AS s(session_key, chunk_idx)
WHERE c.session_key = s.session_key AND c.chunk_idx = s.chunk_idx
"""

_FORGOTTEN_SQL = """
DELETE FROM recalld_memory_chunks c USING recalld_memory_forgotten f
WHERE c.session_key = ANY(%(keys)s) AND f.user_id = c.user_id
  AND (f.session_key IS NULL OR f.session_key = c.session_key)
  AND (f.after_ms IS NULL OR coalesce(c.end_ms, c.start_ms) >= f.after_ms)
  AND (f.before_ms IS NULL OR c.start_ms < f.before_ms)
"""

# memory.retention_days, as the SQLite sync applies it (memory.sqlite.forgetting): a chunk whose
# newest message is older than the cutoff is never kept, so no sync or full reindex brings back
# what the sweep removed.
_EXPIRED_SQL = """
DELETE FROM recalld_memory_chunks WHERE session_key = ANY(%(keys)s) AND end_ms < %(cutoff)s
"""

_PROGRESS_SQL = """
UPDATE recalld_memory_progress p SET indexed_seq = u.seq, indexed_count = u.count,
  seen_updated = u.updated, seen_count = u.seen_count, chunking = %s, indexed_at = now()
FROM unnest(%s::text[], %s::int8[], %s::int4[], %s::text[], %s::int4[])
  AS u(session_key, seq, count, updated, seen_count)
WHERE p.session_key = u.session_key
"""

# The session's share of BM25's corpus statistics, after any change to its chunks.
SESSION_STATS_SQL = """
UPDATE recalld_memory_progress p SET (n_chunks, total_len) = (
  SELECT count(*), coalesce(sum(c.doc_len), 0) FROM recalld_memory_chunks c
  WHERE c.session_key = p.session_key)
WHERE p.session_key = ANY(%s)
"""

class _ClaimerStopped(Exception):
    """Rolls back a claim made after another claimer of the pass failed."""


@dataclass(frozen=True, slots=True)
class _Cut:
    """One claimed session re-chunked, before anything of it is written."""

    key: str
    user: str
    whole: bool                 # every stored chunk goes (settings changed, or messages purged)
    first_idx: int              # stored chunks from this index on are compared with ``chunks``
    chunks: Sequence[Chunk]
    top: int                    # the last message seq read
    count: int                  # messages through ``top``
    seen: tuple[str, int]       # the session's (updated_at, message_count) at the claim


class PgIndexer:
    """One node's share of the indexing; every method is a coroutine on a connection pool."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[TupleRow]], config: MemoryConfig,
                 pipeline: EmbeddingPipeline | None, *,
                 sessions_per_claim: int = SESSIONS_PER_CLAIM,
                 chunks_per_statement: int = CHUNKS_PER_STATEMENT, texts_per_pass: int = 256,
                 claim_workers: int = CLAIM_WORKERS, vector_leg: VectorLeg = "hnsw") -> None:
        self.pool = pool
        self.vector_leg: VectorLeg = vector_leg
        self.config = config
        self.pipeline = pipeline
        window = pipeline.embedder.max_tokens if pipeline is not None else None
        self.sizes = config.sized_for(window)
        self.chunking = chunking_fingerprint(self.sizes)
        self.sessions_per_claim = sessions_per_claim
        self.chunks_per_statement = chunks_per_statement
        self.claim_workers = max(1, claim_workers)
        # Set by a claimer whose batch failed; the pass's other claimers then stop (one pass at
        # a time per indexer: the service's sync lock).
        self._claim_failed = False
        self._deadlocks = 0  # batches of this pass aborted as a deadlock and claimed again
        self.texts_per_pass = texts_per_pass
        self._salt = secrets.token_hex(8)
        self.asserted = False   # this node's identity was made the stored one (ensure_identity)
        self.decides = True     # False: a CLI command, which never changes a recorded identity

    @property
    def identity(self) -> tuple[str, str, str] | None:
        if self.pipeline is None:
            return None
        e = self.pipeline.embedder
        return e.provider, e.model_id, e.endpoint_hash

    async def run_once(self) -> IndexReport:
        """This node's embedder identity made the stored one, then a pass (:meth:`run_pass`)."""
        await self.ensure_identity()
        return await self.run_pass()

    async def run_pass(self) -> IndexReport:
        """Chunk every changed session this node can claim, sweep, then embed what is pending
        (after :meth:`ensure_identity`)."""
        report = IndexReport()
        async with self.pool.connection() as conn:
            if not await pg_feed.ready(conn):
                return report
            await conn.execute(_SEED_SQL)
            await conn.commit()
            await self._sweep(conn, report)
        await self._chunk_changed(report)
        try:
            while self.pipeline is not None and await self._embed_some(report):
                pass
        except EmbedderError as exc:
            # As the SQLite indexer: the pass ends with its chunks written and the report naming
            # the embedder's failure; what stays pending is keyword-searchable and retried.
            report.errors.append(f"embedder: {exc}")
            log.warning("memory.embed.failed", error=str(exc), retryable=exc.retryable,
                        effect="chunks stay pending (keyword-searchable); retried next pass")
            return report
        if self.identity is not None:
            async with self.pool.connection() as conn:
                await ensure_vector_index(conn, self.vector_leg)
            async with self.pool.connection() as conn:   # end_rebuild ends its transactions
                try:
                    await end_rebuild(conn, EmbedderIdentity(*self.identity))
                except (LockNotAvailable, QueryCanceled, DeadlockDetected) as exc:
                    # Another node's batch holds the identity's row or the chunks: the next
                    # pass ends it (nothing is lost meanwhile, the previous model serves).
                    log.info("memory.pg.rebuild_end_deferred", error=type(exc).__name__)
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
            report.sessions_deleted += len(gone)
            if gone:
                cur = await conn.execute(
                    "DELETE FROM recalld_memory_chunks WHERE session_key = ANY(%s)", (gone,))
                report.chunks_deleted += cur.rowcount

    async def _chunk_changed(self, report: IndexReport) -> None:
        """Claim and chunk batches until none is left to this node. Once a claim comes back as a
        full batch, ``claim_workers − 1`` more claimers start, each on a pooled connection of its
        own; a claimer's error stops the others (each batch is its own transaction: what
        committed stays, the rest is claimed again on the next pass) and is raised as it was."""
        helpers: list[asyncio.Task[None]] = []
        self._claim_failed = False
        self._deadlocks = 0

        def full_batch() -> None:
            if not helpers:
                extra = min(self.claim_workers, self.pool.max_size) - 1
                helpers.extend(asyncio.create_task(self._claim_on_own_connection(report))
                               for _ in range(extra))

        try:
            async with self.pool.connection() as conn:
                while await self._claim_and_chunk(conn, report, full_batch):
                    pass
            if helpers:
                done, _ = await asyncio.wait(helpers, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    if (error := task.exception()) is not None:
                        raise error
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _claim_on_own_connection(self, report: IndexReport) -> None:
        async with self.pool.connection() as conn:
            while await self._claim_and_chunk(conn, report):
                pass

    async def _claim_and_chunk(self, conn: AsyncConnection[TupleRow], report: IndexReport,
                               full_batch: Callable[[], None] | None = None) -> bool:
        """One batch of claimed sessions in one transaction: each session's messages are read
        and cut on its own, then the batch's chunks, deletes and progress are written in a few
        statements (a batch of chunks costs about what one chunk did, row by row). False when
        nothing was left to claim, or another claimer of the pass failed; ``full_batch`` is
        called as soon as the claim is a full one."""
        if self._claim_failed:
            return False
        batch = IndexReport()  # added to ``report`` once the batch has committed
        try:
            async with conn.transaction():
                try:
                    claimed = await (await conn.execute(_CLAIM_SQL, {
                        "chunking": self.chunking, "limit": self.sessions_per_claim})).fetchall()
                    if not claimed:
                        return False
                    if self._claim_failed:
                        # Another claimer failed while this claim ran: its sessions may be among
                        # these (released by its rollback); they wait for the next pass.
                        raise _ClaimerStopped
                    if full_batch is not None and len(claimed) >= self.sessions_per_claim:
                        full_batch()
                    keys = [str(k) for k, *_ in claimed]
                    last = {str(k): (int(i), int(q), int(g)) for k, i, q, g in
                            await (await conn.execute(_LAST_CHUNKS_SQL, (keys,))).fetchall()}
                    cuts = [await self._cut_session(conn, str(key), str(user), int(indexed_seq),
                                                    int(indexed_count), str(chunking),
                                                    (str(updated), int(seen_count)),
                                                    last.get(str(key)))
                            for key, user, indexed_seq, indexed_count, chunking, updated,
                            seen_count in claimed]
                    await self._write_cuts(conn, cuts, batch)
                except BaseException as exc:
                    # Set before the rollback releases this batch's sessions: a claimer still
                    # running takes no further batch, so it cannot take them up in this pass
                    # (a deadlock's batch is claimed again, below).
                    if not isinstance(exc, DeadlockDetected):
                        self._claim_failed = True
                    raise
        except _ClaimerStopped:
            return False
        except DeadlockDetected:
            # Another transaction changed postings blocks or statistics rows this batch changes
            # (a second claimer or node, a forget) and PostgreSQL aborted this one: the rollback
            # released the sessions, which are claimed again, a few times in a pass.
            self._deadlocks += 1
            if self._deadlocks > _DEADLOCK_RETRIES:
                self._claim_failed = True
                raise
            log.info("memory.pg.batch_retried", error="DeadlockDetected", retry=self._deadlocks)
            return True
        report.sessions += batch.sessions
        report.chunks_written += batch.chunks_written
        report.chunks_deleted += batch.chunks_deleted
        return True

    async def _cut_session(self, conn: AsyncConnection[TupleRow], key: str, user: str,
                           indexed_seq: int, indexed_count: int, chunking: str,
                           seen: tuple[str, int], last: tuple[int, int, int] | None) -> _Cut:
        """Re-chunk one claimed session (nothing written yet); ``seen`` is its (updated_at,
        message_count) at the claim, recorded so the session is claimed again only when they
        move (never in a loop when a count disagrees with the rows)."""
        # No message has a seq below 0: a session never indexed needs no count.
        still = await pg_feed.count_through(conn, key, indexed_seq) if indexed_seq >= 0 else 0
        whole = chunking != self.chunking or still != indexed_count
        if whole:
            last = None
        first_idx, start_seq, skip = (0, 0, 0) if last is None else last
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
        top = int(rows[-1].seq) if rows else indexed_seq
        # Read from seq 0, the rows are every message through ``top`` (one snapshot, no count).
        count = len(rows) if start_seq == 0 else await pg_feed.count_through(conn, key, top)
        return _Cut(key, user, whole, first_idx, chunks, top, count, seen)

    async def _write_cuts(self, conn: AsyncConnection[TupleRow], cuts: Sequence[_Cut],
                          report: IndexReport) -> None:
        """A batch's cuts: sessions re-cut whole lose every chunk, then identical chunks stay,
        changed or new ones are written, surplus ones deleted, forgotten ranges applied, and
        each session's progress and BM25 statistics recorded."""
        keys = [c.key for c in cuts]
        whole = [c.key for c in cuts if c.whole]
        if whole:
            cur = await conn.execute(
                "DELETE FROM recalld_memory_chunks WHERE session_key = ANY(%s)", (whole,))
            report.chunks_deleted += cur.rowcount
        kept = [c for c in cuts if not c.whole]
        stored: dict[str, dict[int, str]] = {c.key: {} for c in cuts}
        if kept:
            for key, idx, content_hash in await (await conn.execute(
                    _STORED_SQL, ([c.key for c in kept], [c.first_idx for c in kept]))).fetchall():
                stored[str(key)][int(idx)] = str(content_hash)
        fresh = [(c, chunk) for c in cuts for chunk in c.chunks
                 if stored[c.key].get(chunk.idx) != chunk.content_hash]
        if fresh:
            await conn.execute("SELECT set_config('work_mem', %s, true)", (_BATCH_WORK_MEM,))
        for start in range(0, len(fresh), self.chunks_per_statement):
            part = fresh[start:start + self.chunks_per_statement]
            rows = orjson.dumps([
                dict(zip(_CHUNK_COLUMNS, self._row(c.user, c.key, chunk), strict=True))
                for c, chunk in part]).decode()
            await conn.execute(_UPSERT_CHUNKS_SQL, (rows,))
        report.chunks_written += len(fresh)
        # During a rebuild: the previous vectors of the texts the previous model embedded.
        await fill_previous(conn, [(c.key, chunk.idx) for c, chunk in fresh])
        surplus = [(c.key, idx) for c in cuts for idx in stored[c.key]
                   if idx >= c.first_idx + len(c.chunks)]
        if surplus:
            cur = await conn.execute(_SURPLUS_SQL,
                                     ([k for k, _ in surplus], [i for _, i in surplus]))
            report.chunks_deleted += cur.rowcount
        await conn.execute(_FORGOTTEN_SQL, {"keys": keys})
        cutoff = retention_cutoff_ms(self.config.retention_days)
        if cutoff is not None:
            await conn.execute(_EXPIRED_SQL, {"keys": keys, "cutoff": cutoff})
        await conn.execute(_PROGRESS_SQL, (self.chunking, keys, [c.top for c in cuts],
                                           [c.count for c in cuts], [c.seen[0] for c in cuts],
                                           [c.seen[1] for c in cuts]))
        await conn.execute(SESSION_STATS_SQL, (keys,))
        report.sessions += len(cuts)

    def _row(self, user: str, key: str, c: Chunk) -> tuple[Any, ...]:
        """One chunk's values in ``_CHUNK_COLUMNS``' order (``fts`` None: the content itself)."""
        sent = self.pipeline.text_to_send(c.content) if self.pipeline is not None else c.content
        fts = fts_text(c.content)
        return (user, key, c.idx, c.content, c.line_start, c.line_end, c.byte_start, c.seg_start,
                c.start_ts, c.end_ts, iso_to_ms(c.start_ts), iso_to_ms(c.end_ts), c.content_hash,
                c.content_hash if sent == c.content else sha256_text(sent),
                None if fts == c.content else fts, _token_count(fts))

    # --- vectors ------------------------------------------------------------------------

    async def ensure_identity(self) -> None:
        """This node's embedder identity made the stored one, once: a new one starts a rebuild
        (memory.pg.vectors, "Embedder change"); another stored later is a newer node's, which
        this one leaves alone ("The node started last decides"). A node without an embedder
        leaves the vectors as they are."""
        if self.identity is None or self.asserted:
            return
        async with self.pool.connection() as conn, conn.transaction():
            if self.decides:
                await start_rebuild(conn, EmbedderIdentity(*self.identity))
            else:   # a command records one only where none is: nothing to undo
                await record_first(conn, EmbedderIdentity(*self.identity))
        self.asserted = True

    async def _embed_some(self, report: IndexReport) -> bool:
        """One batch of distinct pending texts; False when it filled no chunk (nothing pending, or
        every pending text is another node's to embed right now)."""
        assert self.pipeline is not None and self.identity is not None
        provider, model, endpoint = self.identity
        params = {"provider": provider, "model": model, "endpoint_hash": endpoint}
        async with self.pool.connection() as conn, conn.transaction():
            if not await holds_identity(conn, EmbedderIdentity(provider, model, endpoint)):
                return False   # the stored identity is another now: this node's next pass meets it
            pending = await (await conn.execute(PENDING_SQL,
                                                (self._salt, self.texts_per_pass))).fetchall()
            if not pending:
                return False
            hashes = [str(h) for h, _ in pending]
            # First what the cache already holds (another node's work, or another session's text).
            before = report.filled
            cur = await conn.execute(FILL_SQL, {**params, "hashes": hashes})
            report.filled += cur.rowcount
            locked = await (await conn.execute(
                "SELECT h FROM unnest(%s::text[]) AS h "
                "WHERE pg_try_advisory_xact_lock(%s, hashtext(h))",
                (hashes, EMBED_LOCK))).fetchall()
            mine = {str(h) for (h,) in locked}
            cached = {str(h) for (h,) in await (await conn.execute(
                "SELECT content_hash FROM recalld_memory_embedding_cache "
                "WHERE provider = %(provider)s AND model = %(model)s "
                "AND endpoint_hash = %(endpoint_hash)s AND content_hash = ANY(%(hashes)s)",
                {**params, "hashes": list(mine)})).fetchall()}
            texts = {str(h): self.pipeline.text_to_send(str(content)) for h, content in pending
                     if str(h) in mine and str(h) not in cached}
            failed = await self._embed_into_cache(conn, texts, report) if texts else None
            cur = await conn.execute(FILL_SQL, {**params, "hashes": list(mine)})
            report.filled += cur.rowcount
            filled = report.filled > before
        # Raised once what the embedder answered before it failed is committed (as the SQLite
        # indexer commits each call's vectors): a failing call loses only its own texts.
        if failed is not None:
            raise failed
        return filled

    async def _embed_into_cache(self, conn: AsyncConnection[TupleRow], texts: dict[str, str],
                                report: IndexReport) -> EmbedderError | None:
        """Embed ``texts`` call by call into the cache; the error of the call that failed (the
        vectors of the calls before it are in the cache), or None."""
        assert self.pipeline is not None and self.identity is not None
        order = list(texts)
        vectors: list[list[float]] = []
        failed: EmbedderError | None = None
        for batch in self.pipeline.batches([texts[h] for h in order]):
            try:
                vectors.extend(await self.pipeline.embed_batch(batch))
            except EmbedderError as exc:
                failed = exc
                break
        report.embedded += len(vectors)
        await store_in_cache(conn, EmbedderIdentity(*self.identity),
                             dict(zip(order, vectors, strict=False)))
        return failed


def _entries(rows: Sequence[pg_feed.FeedMessage]) -> list[TranscriptEntry]:
    """Message rows as the chunker reads a transcript: a message's line is its ``seq + 2`` and
    its offset its ``seq``; only ``replaces`` of the line's other keys matters to indexing."""
    return [TranscriptEntry(int(seq) + 2, int(seq), Message(
                str(mid), str(role), str(content), str(ts), run_id, name,
                {REPLACES_KEY: replaces} if isinstance(replaces, str) else {}))
            for seq, mid, role, content, ts, run_id, name, replaces in rows]
