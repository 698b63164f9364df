"""Indexing ``recalld_messages`` into the PostgreSQL index: the SQLite path's chunks, shared
work across nodes, each text embedded once, nothing left of deleted or incognito sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import apsw
import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.embedders.embeddings import EmbeddingPipeline
from memory.pg.indexer import SESSION_STATS_SQL, PgIndexer
from memory.pg.migrations import TS_CONFIG
from sessions import parse_ts
from tests.memory.conftest import (
    FakeEmbedder,
    append_messages,
    opened,
    quiet_config,
    session_key,
    ts,
    write_transcript,
)
from tests.memory.pg.conftest import add_session, chunk_rows, key_of, sessions_store

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

# Small chunks, so that a few messages make several chunks and a long one is cut into segments.
CONFIG = quiet_config(chunk_tokens=40, overlap_tokens=10)
LONG = " ".join(f"word{i} of a long message about sailing boats" for i in range(12))
FIRST = ["I keep bees in the garden.", LONG, "How many hives?", "Three hives, since last spring."]
MORE = ["The queen of the second hive is new.", "Did she come from a breeder?", LONG + " and more"]


def indexer(pool: Pool, embedder: Any = None) -> PgIndexer:
    return PgIndexer(pool, CONFIG, EmbeddingPipeline(embedder) if embedder is not None else None)


async def sqlite_chunks(tmp_path: Path,
                        messages: list[list[str]]) -> list[tuple[int, str, int, int]]:
    """The chunks the SQLite path makes of the same messages, appended in the same steps."""
    path = write_transcript(tmp_path, "alice", "s1", messages[0])
    async with opened(tmp_path, CONFIG, None) as svc:
        for i, step in enumerate(messages[1:], start=1):
            append_messages(path, step, start_minute=sum(len(m) for m in messages[:i]))
            await svc.sync_now()
    db = apsw.Connection(str(tmp_path / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = list(db.execute("SELECT chunk_idx, content, line_start, line_end FROM chunks "
                               "ORDER BY chunk_idx"))
    finally:
        db.close()
    return [(int(a), str(b), int(c), int(d)) for a, b, c, d in rows]


async def test_chunks_equal_the_sqlite_paths_for_the_same_messages(
        tmp_path: Path, pg_index: str, pool: Pool) -> None:
    """Whole and incremental, the PostgreSQL index holds exactly the chunks (text and line
    ranges) the transcript indexer makes of the same messages."""
    key = session_key("s1")
    add_session(pg_index, "alice", key, FIRST)
    await indexer(pool).run_once()
    add_session(pg_index, "alice", key, MORE, start_minute=len(FIRST), create=False)
    report = await indexer(pool).run_once()
    assert report.sessions == 1
    expected = await sqlite_chunks(tmp_path, [FIRST, MORE])
    assert len(expected) > 3
    assert [(idx, content, a, b) for _, idx, content, a, b in chunk_rows(pg_index)] == expected


async def test_two_nodes_share_the_work_and_embed_each_text_once(pg_index: str) -> None:
    """Two indexers over one database, run together: every session is chunked by one of them,
    and every distinct chunk text — including one said in two sessions — is embedded once."""
    for i in range(12):
        add_session(pg_index, f"user{i % 3}", f"key{i:02d}", [f"session {i} talks about topic {i}",
                                                                "the same reply everywhere"])
    add_session(pg_index, "user0", "twin-a", ["an identical conversation"])
    add_session(pg_index, "user1", "twin-b", ["an identical conversation"])
    a, b = FakeEmbedder(), FakeEmbedder()
    async with AsyncConnectionPool(pg_index, min_size=1, max_size=2, open=False) as pa, \
            AsyncConnectionPool(pg_index, min_size=1, max_size=2, open=False) as pb:
        first, second = await asyncio.gather(indexer(pa, a).run_once(), indexer(pb, b).run_once())
        assert first.sessions + second.sessions == 14
        assert await indexer(pa, a).pending() == 0
    texts = a.texts + b.texts
    assert len(texts) == len(set(texts))
    with psycopg.connect(pg_index) as conn:
        distinct = conn.execute(
            "SELECT count(DISTINCT content) FROM recalld_memory_chunks").fetchone()
        cache = conn.execute("SELECT count(*) FROM recalld_memory_embedding_cache").fetchone()
    assert distinct is not None and cache is not None
    assert len(texts) == distinct[0] == cache[0] == 13


async def test_a_new_node_reuses_the_shared_cache(pg_index: str, pool: Pool) -> None:
    """After a full re-chunk, every vector comes from the cache: nothing is embedded again."""
    add_session(pg_index, "alice", "k1", FIRST)
    await indexer(pool, FakeEmbedder()).run_once()
    again = FakeEmbedder()
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("UPDATE recalld_memory_progress SET chunking = 'reset'")
        conn.execute("UPDATE recalld_memory_chunks SET embedding = NULL")
    report = await indexer(pool, again).run_once()
    assert again.calls == [] and report.filled == len(chunk_rows(pg_index)) > 0


async def test_deleted_incognito_and_purged_leave_no_chunks(pg_index: str, pool: Pool) -> None:
    """A deleted session's chunks go, an incognito session is never indexed, and purged messages
    leave nothing behind (the session is re-chunked whole)."""
    add_session(pg_index, "alice", "gone", ["delete me later"])
    add_session(pg_index, "alice", "secret", ["never index this"], memory=False)
    add_session(pg_index, "alice", "purged", ["keep this line", "purge this line", "and keep this"])
    await indexer(pool).run_once()
    assert {k for k, *_ in chunk_rows(pg_index)} == {"gone", "purged"}
    with sessions_store(pg_index) as store:
        store.delete("alice", key_of("gone"))
        # the second message, said at minute 1
        assert store.purge_messages("alice", key_of("purged"), after=parse_ts(ts(0.5)),
                                    before=parse_ts(ts(1.5))) == 1
    await indexer(pool).run_once()
    rows = chunk_rows(pg_index)
    assert {k for k, *_ in rows} == {"purged"}
    assert all("purge this line" not in content for _, _, content, _, _ in rows)
    assert any("and keep this" in content for _, _, content, _, _ in rows)


async def test_a_session_is_claimed_again_only_when_it_changes(pg_index: str, pool: Pool) -> None:
    """A pass that finds nothing new claims nothing, even when the session's counter disagrees
    with its rows; the next append is claimed once."""
    add_session(pg_index, "alice", "k1", ["first words"])
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("UPDATE recalld_sessions SET message_count = 7 WHERE session_key = %s",
                     (key_of("k1"),))
    assert (await indexer(pool).run_once()).sessions == 1
    assert (await indexer(pool).run_once()).sessions == 0
    add_session(pg_index, "alice", "k1", ["more words"], start_minute=1, create=False)
    assert (await indexer(pool).run_once()).sessions == 1
    assert [c for _, _, c, _, _ in chunk_rows(pg_index)] == [
        "user [2026-11-22T10:00:00.000Z]: first words\nuser [2026-11-22T10:01:00.000Z]: more words"]


def _assert_postings_exact(dsn: str) -> dict[str, tuple[int, int]]:
    """The totals, after checking the postings are the chunks' lexemes, each exactly."""
    totals = _totals(dsn)
    assert totals["postings"][0] == totals["postings"][1] and totals["differ"] == (0, 0), totals
    return totals


def _totals(dsn: str) -> dict[str, tuple[int, int]]:
    """BM25's totals as searches read them, as the chunks hold them, and postings vs lexemes."""
    with psycopg.connect(dsn) as conn:
        def one(sql: str) -> tuple[int, int]:
            row = conn.execute(sql).fetchone()
            assert row is not None
            return int(row[0] or 0), int(row[1] or 0)
        return {"corpus": one("SELECT sum(n_chunks), sum(total_len) FROM recalld_memory_corpus"),
                "chunks": one("SELECT count(*), sum(doc_len) FROM recalld_memory_chunks"),
                "postings": one(f"SELECT (SELECT count(*) FROM ({_POSTED}) AS p), "
                                "(SELECT sum(length(tsv)) FROM recalld_memory_chunks)"),
                # Each posting exactly: (lexeme, user, chunk, tf, length) in one and not the other.
                "differ": one(f"SELECT (SELECT count(*) FROM ({_POSTED} EXCEPT ALL {_LEXEMES}) a),"
                              f" (SELECT count(*) FROM ({_LEXEMES} EXCEPT ALL {_POSTED}) b)")}


# The postings as rows (their blocks unnested), and what the chunks' own lexemes say they are.
_POSTED = ("SELECT b.lexeme, b.user_id, p.chunk_id, p.tf, p.doc_len FROM recalld_memory_postings b"
           " CROSS JOIN unnest(b.chunk_ids, b.tfs, b.doc_lens) AS p(chunk_id, tf, doc_len)")
_LEXEMES = ("SELECT u.lexeme, c.user_id, c.id, coalesce(array_length(u.positions, 1), 1), c.doc_len"
            " FROM recalld_memory_chunks c CROSS JOIN unnest(c.tsv) AS u")


async def test_corpus_totals_and_postings_follow_every_change(pg_index: str, pool: Pool) -> None:
    """The few rows keyword search reads BM25's N and length from equal the chunks' own count and
    length, and the postings the chunks' lexemes, after batched writes, appends that rewrite a
    chunk, purges, deleted sessions and deletes outside the indexer."""
    for i in range(5):
        add_session(pg_index, "alice", f"s{i}", FIRST)
    add_session(pg_index, "bob", "b1", MORE)
    await PgIndexer(pool, CONFIG, None, sessions_per_claim=2, chunks_per_statement=3).run_once()
    first = _assert_postings_exact(pg_index)
    assert first["corpus"] == first["chunks"] and first["corpus"][0] > 6
    add_session(pg_index, "alice", "s1", MORE, start_minute=10, create=False)
    with sessions_store(pg_index) as store:
        store.delete("alice", key_of("s2"))
        assert store.purge_messages("alice", key_of("s3"), after=parse_ts(ts(0.5)),
                                    before=parse_ts(ts(1.5))) == 1
    await indexer(pool).run_once()
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("DELETE FROM recalld_memory_chunks WHERE session_key = %s", (key_of("s4"),))
        conn.execute(SESSION_STATS_SQL, ([key_of("s4")],))
    after = _assert_postings_exact(pg_index)
    assert after["corpus"] == after["chunks"] != first["chunks"]
    # A chunk's words change (as a re-cut's upsert changes them): its postings move to a block
    # of its own; then its session goes, and no posting of it is left.
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute(f"UPDATE recalld_memory_chunks SET tsv = to_tsvector('{TS_CONFIG}', content"
                     " || ' queen bees swarm'), doc_len = doc_len + 3 WHERE id = (SELECT min(id)"
                     " FROM recalld_memory_chunks WHERE session_key = %s)", (key_of("s0"),))
    _assert_postings_exact(pg_index)
    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("DELETE FROM recalld_memory_chunks WHERE session_key = %s", (key_of("s0"),))
    _assert_postings_exact(pg_index)


async def test_postings_written_in_rows_are_regrouped_in_blocks_by_m006(pg_dsn: str) -> None:
    """A database indexed before m006 (one posting row per lexeme and chunk) keeps every posting
    when m006 regroups them in blocks, and later writes and deletes keep them exact."""
    from memory.pg.migrations import _M007, migrate
    from sessions.pg.store import PgSessionStore

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, before="m006_postings_in_blocks")
        # This version's indexer writes the rows here and needs m007's column, which m006's
        # regrouping never reads.
        conn.execute(_M007)
    PgSessionStore(pg_dsn, pool_size=1).close()
    for i in range(4):
        add_session(pg_dsn, "alice" if i % 2 else "bob", f"s{i}", FIRST + MORE)
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=2, open=False) as pool:
        await PgIndexer(pool, CONFIG, None, chunks_per_statement=5).run_once()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT count(*) FROM recalld_memory_postings").fetchone()
            assert rows is not None and rows[0] > 0
            assert migrate(conn) == ["m006_postings_in_blocks", "m007_previous_embedding"]
        assert _assert_postings_exact(pg_dsn)["postings"][0] > 0
        with sessions_store(pg_dsn) as store:
            store.delete("bob", key_of("s0"))
        add_session(pg_dsn, "alice", "s1", ["The hives are quiet today."], start_minute=30,
                    create=False)
        await PgIndexer(pool, CONFIG, None).run_once()
    _assert_postings_exact(pg_dsn)


def _recut_sql(chunk_id: int) -> str:
    return (f"UPDATE recalld_memory_chunks SET tsv = to_tsvector('{TS_CONFIG}', content || "
            f"' queen swarm'), doc_len = doc_len + 2 WHERE id = {int(chunk_id)}")


@pytest.mark.parametrize("first", ["re-cut", "delete"])
async def test_changes_of_one_block_in_two_transactions_keep_every_posting(
        pg_index: str, pool: Pool, first: str) -> None:
    """Two transactions changing chunks of one block at once (a re-cut, or a delete, while
    another chunk of it is re-cut and waits on the block's rows) leave the postings exactly the
    chunks' lexemes: the waiting one removes its chunk from the block as it is then, not as its
    snapshot saw it."""
    add_session(pg_index, "alice", "s0", FIRST + MORE)
    await PgIndexer(pool, CONFIG, None).run_once()  # one statement: the chunks share blocks
    with psycopg.connect(pg_index, autocommit=True) as conn:
        ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM recalld_memory_chunks ORDER BY id").fetchall()]
    assert len(ids) >= 4
    first_sql = (_recut_sql(ids[1]) if first == "re-cut"
                 else f"DELETE FROM recalld_memory_chunks WHERE id = {ids[0]}")
    with psycopg.connect(pg_index) as one, psycopg.connect(pg_index) as two:
        one.execute(first_sql)  # holds the shared blocks' rows until it commits
        def recut_last() -> None:
            two.execute(_recut_sql(ids[-1]))
            two.commit()

        waiting = asyncio.create_task(asyncio.to_thread(recut_last))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # it waits on the rows `one` changed
        one.commit()
        await asyncio.wait_for(waiting, 30)
    _assert_postings_exact(pg_index)


async def test_a_batch_aborted_as_a_deadlock_is_claimed_again_not_raised(
        pg_index: str, pool: Pool) -> None:
    """When PostgreSQL aborts an indexing batch as a deadlock (here with a transaction holding
    the postings rows its re-cut needs and then asking for the session's claim row), the pass
    does not fail: the batch is rolled back and its session indexed again, exactly."""
    add_session(pg_index, "alice", "s0", FIRST)
    add_session(pg_index, "alice", "s1", MORE)
    await indexer(pool).run_once()  # one statement: s0's and s1's chunks share blocks
    with sessions_store(pg_index) as store:  # s0 is re-chunked whole: its chunks are deleted
        assert store.purge_messages("alice", key_of("s0"), after=parse_ts(ts(0.5)),
                                    before=parse_ts(ts(1.5))) == 1
    with psycopg.connect(pg_index) as holder:
        # This side waits long before it checks for a deadlock, so the indexer's side is the
        # one PostgreSQL aborts.
        holder.execute("SET deadlock_timeout = '60s'")
        holder.execute("SELECT 1 FROM recalld_memory_postings FOR UPDATE")
        passing = asyncio.create_task(indexer(pool).run_once())
        with psycopg.connect(pg_index, autocommit=True) as watch:
            async with asyncio.timeout(20):
                while not watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND pid <> pg_backend_pid()").fetchone() == (1,):
                    await asyncio.sleep(0.05)
        await asyncio.to_thread(holder.execute, "SELECT 1 FROM recalld_memory_progress"
                                " WHERE session_key = %s FOR UPDATE", (key_of("s0"),))
        holder.commit()
        await asyncio.wait_for(passing, 30)  # no DeadlockDetected
    await indexer(pool).run_once()
    _assert_postings_exact(pg_index)
    texts = " ".join(c for _, _, c, _, _ in chunk_rows(pg_index, "s0"))
    assert FIRST[0] in texts and "word0 of a long" not in texts  # re-chunked without the purged
