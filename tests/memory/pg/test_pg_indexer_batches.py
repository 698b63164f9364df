"""The PostgreSQL indexer's bulk path: several claimers in one pass (each batch still atomic),
and a batch's rows sent as JSON keep every character, the FTS text and the token count."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.chunking import fts_text
from memory.pg.indexer import PgIndexer, doc_length
from memory.pg.migrations import TS_CONFIG
from tests.memory.conftest import quiet_config
from tests.memory.pg.conftest import add_session, chunk_rows, key_of

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

CONFIG = quiet_config(chunk_tokens=40, overlap_tokens=10)
TALK = ["We sailed to the island at dawn.", "Was the sea calm?",
        "Calm until noon, then a squall came in.", "Did you reef the main?",
        "Twice, and the jib came down too."]


class Recording(PgIndexer):
    """Records which backend wrote each batch, and can fail one batch after writing all of it."""

    def __init__(self, pool: Pool, *, fail_batch: int | None = None, **kwargs: Any) -> None:
        super().__init__(pool, CONFIG, None, **kwargs)
        self.backends: list[int] = []
        self.fail_batch = fail_batch
        self.failed_keys: list[str] = []
        self._batches = 0

    async def _claim_and_chunk(self, conn: AsyncConnection[TupleRow], report: Any,
                               full_batch: Callable[[], None] | None = None) -> bool:
        wrote = await super()._claim_and_chunk(conn, report, full_batch)
        if wrote:
            self.backends.append(conn.info.backend_pid)
        return wrote

    async def _write_cuts(self, conn: AsyncConnection[TupleRow], cuts: Sequence[Any],
                          report: Any) -> None:
        await super()._write_cuts(conn, cuts, report)
        self._batches += 1
        if self._batches == self.fail_batch:
            self.failed_keys = [c.key for c in cuts]
            raise psycopg.OperationalError("injected: the batch fails before its commit")


def _sessions(dsn: str, n: int) -> list[str]:
    for i in range(n):
        add_session(dsn, f"user{i % 2}", f"batch{i:02d}", [f"{line} ({i})" for line in TALK])
    return [key_of(f"batch{i:02d}") for i in range(n)]


def _state(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        progress = {str(k): int(s) for k, s in conn.execute(
            "SELECT session_key, indexed_seq FROM recalld_memory_progress").fetchall()}
        chunked = {str(k) for (k,) in conn.execute(
            "SELECT DISTINCT session_key FROM recalld_memory_chunks")}
        totals = conn.execute(
            "SELECT (SELECT sum(n_chunks) FROM recalld_memory_corpus),"
            " (SELECT count(*) FROM recalld_memory_chunks),"
            " (SELECT coalesce(sum(cardinality(chunk_ids)), 0) FROM recalld_memory_postings),"
            " (SELECT sum(length(tsv)) FROM recalld_memory_chunks)"
        ).fetchone()
    assert totals is not None
    return {"progress": progress, "chunked": chunked, "totals": [int(t or 0) for t in totals]}


async def test_claimers_share_one_pass_and_write_what_one_would(pg_index: str) -> None:
    """A pass whose first claim is full starts a second claimer on its own connection: every
    session is written once, and the chunks are those a single claimer writes."""
    keys = _sessions(pg_index, 12)
    # Both connections open before the pass, so the second claimer need not wait for one.
    async with AsyncConnectionPool(pg_index, min_size=2, max_size=2, open=False) as pool:
        await pool.wait()
        await _claimers_share_one_pass(pg_index, pool, keys)


async def _claimers_share_one_pass(pg_index: str, pool: Pool, keys: list[str]) -> None:
    one = Recording(pool, sessions_per_claim=2, claim_workers=1)
    await one.run_once()
    alone = chunk_rows(pg_index)
    assert len(set(one.backends)) == 1
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("UPDATE recalld_memory_progress SET chunking = 'reset'")
    two = Recording(pool, sessions_per_claim=2, claim_workers=2)
    report = await two.run_once()
    assert report.sessions == len(keys) and len(two.backends) == 6
    assert len(set(two.backends)) == 2
    assert chunk_rows(pg_index) == alone
    state = _state(pg_index)
    assert state["chunked"] == set(keys) and all(seq >= 0 for seq in state["progress"].values())
    corpus, chunks, postings, lexemes = state["totals"]
    assert corpus == chunks == len(alone) and postings == lexemes


async def test_a_pass_of_a_few_sessions_uses_one_connection(pg_index: str, pool: Pool) -> None:
    _sessions(pg_index, 3)
    few = Recording(pool, sessions_per_claim=4, claim_workers=2)
    assert (await few.run_once()).sessions == 3
    assert len(few.backends) == 1


async def test_a_failed_batch_is_undone_whole_and_stops_the_other_claimer(pg_index: str,
                                                                           pool: Pool) -> None:
    """A claimer's error rolls its batch back entirely (no chunk, posting or progress of its
    sessions), the other claimer stops, the error comes out as it was raised, and the next pass
    indexes what is left."""
    keys = _sessions(pg_index, 12)
    failing = Recording(pool, sessions_per_claim=2, claim_workers=2, fail_batch=2)
    with pytest.raises(psycopg.OperationalError, match="injected"):
        await failing.run_once()
    state = _state(pg_index)
    assert failing.failed_keys and not set(failing.failed_keys) & state["chunked"]
    assert all(state["progress"][k] == -1 for k in failing.failed_keys)
    # Every session is written whole or not at all, and the totals follow what committed.
    assert {k for k, seq in state["progress"].items() if seq >= 0} == state["chunked"]
    corpus, chunks, postings, lexemes = state["totals"]
    assert corpus == chunks and postings == lexemes
    report = await Recording(pool, sessions_per_claim=2, claim_workers=2).run_once()
    assert report.sessions == len(keys) - len(state["chunked"])
    assert _state(pg_index)["chunked"] == set(keys)


async def test_every_character_survives_the_json_rows(pg_index: str, pool: Pool) -> None:
    """Quotes, backslashes, newlines, tabs, emoji and CJK reach the chunk as written; the lexemes
    are PostgreSQL's of the FTS text (CJK spaced out, sent only where it differs from the
    content), and the token count is the chunker's."""
    odd = ['He said "hold on" \\ then left.\n\tA tab, a {brace}, [1,2] and null.',
           "東京で会いましょう 🙂 meet in Tokyo", "plain words only"]
    add_session(pg_index, "alice", "odd", odd)
    await PgIndexer(pool, quiet_config(), None).run_once()
    with psycopg.connect(pg_index) as conn:
        rows = conn.execute("SELECT content, doc_len, tsv::text, start_ms, end_ms "
                            "FROM recalld_memory_chunks").fetchall()
        assert len(rows) == 1
        content, doc_len, tsv, start_ms, end_ms = rows[0]
        expected = conn.execute(f"SELECT to_tsvector('{TS_CONFIG}', %s)::text",
                                (fts_text(content),)).fetchone()
    assert expected is not None
    assert all(text in content for text in odd)
    assert fts_text(content) != content and tsv == expected[0] and "東" in tsv
    assert doc_len == doc_length(content)
    assert isinstance(start_ms, int) and isinstance(end_ms, int) and end_ms > start_ms
