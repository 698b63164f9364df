"""``PgMemory``: a node's indexing loop wakes on the sessions store's notifications, and the
thin surface answers search, status, forget and reindex."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from memory.pg.service import PgMemory
from memory.sqlite.forgetting import ForgetRange
from tests.memory.conftest import FakeEmbedder, quiet_config
from tests.memory.pg.conftest import add_session, chunk_rows, key_of, name_for


async def found(node: PgMemory, query: str, **kwargs: Any) -> list[str]:
    """The sessions ``query`` finds, waiting (boundedly) for the node's loop to index them."""
    for _ in range(200):
        hits = (await node.search("alice", query, mode="hybrid", **kwargs)).results
        if hits:
            return [name_for(h.session_key) for h in hits]
        await asyncio.sleep(0.05)
    return []


async def test_appends_through_another_node_are_indexed_without_a_call(pg_index: str,
                                                                       tmp_path: Path) -> None:
    """A message committed anywhere wakes this node's loop (NOTIFY), which indexes it: the
    search finds it with no sync call; status counts it."""
    node = await PgMemory.open(pg_index, quiet_config(debounce_ms=0), FakeEmbedder(),
                               data_dir=tmp_path, poll_s=60)
    await node.start()
    try:
        for _ in range(200):  # the catch-up pass is over: what follows is found through NOTIFY
            if node.loop_passes:
                break
            await asyncio.sleep(0.05)
        assert node.loop_passes == 1
        add_session(pg_index, "alice", "k1", ["my favourite language is rust"])
        assert await found(node, "favourite language") == ["k1"]
        # The keyword leg finds the chunk as soon as it is written; its vector is stored by the
        # same pass a moment later, so status is read once nothing is pending (boundedly).
        for _ in range(200):
            status = await node.status()
            if status["pending"] == 0:
                break
            await asyncio.sleep(0.05)
        assert (status["chunks"], status["pending"], status["lastError"]) == (1, 0, None)
    finally:
        await node.close()
        await node.close()


async def test_forget_and_full_reindex(pg_index: str, tmp_path: Path) -> None:
    """Forgotten chunks go now and stay gone after a full reindex; the reindex re-embeds nothing."""
    embedder = FakeEmbedder()
    node = await PgMemory.open(pg_index, quiet_config(), embedder, data_dir=tmp_path)
    try:
        add_session(pg_index, "alice", "k1", ["the garden gate is green"])
        add_session(pg_index, "alice", "k2", ["the kitchen door is red"])
        await node.sync_now()
        assert (await node.forget(ForgetRange("alice", session_key=key_of("k1")), record=True)
                == {"chunks": 1, "facts": 0, "episodes": 0})
        embedded = len(embedder.texts)
        await node.reindex(full=True)
        await node.sync_now()
        assert {k for k, *_ in chunk_rows(pg_index)} == {"k2"}
        assert len(embedder.texts) == embedded
        assert (await node.search("alice", "garden gate", mode="keyword")).results == []
    finally:
        await node.close()


class _CancelTurnedIntoError(FakeEmbedder):
    """An embedder that blocks until cancelled and then raises something else, as psycopg does
    when a cancel lands inside its pipeline (an AssertionError from its own bookkeeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise AssertionError("the library's own error instead of the cancel") from None
        raise AssertionError("unreachable")


async def test_close_finishes_when_the_cancelled_loop_ends_with_another_error(
        pg_index: str, tmp_path: Path) -> None:
    """Closing a node whose indexing loop answers the cancel with an error of its own (not
    CancelledError) still stops the loop and closes the pool, without raising."""
    embedder = _CancelTurnedIntoError()
    node = await PgMemory.open(pg_index, quiet_config(debounce_ms=0), embedder, data_dir=tmp_path,
                               poll_s=60)
    add_session(pg_index, "alice", "k1", ["the loop is embedding this when the node closes"])
    await node.start()
    await asyncio.wait_for(embedder.entered.wait(), 30)
    await node.close()
    assert node.pool.closed


async def test_a_delete_aborted_as_a_deadlock_is_retried(pg_index: str, tmp_path: Path) -> None:
    """A chunk delete that PostgreSQL aborts as a deadlock (an indexer writing the same session
    at that moment) is tried again and removes the chunks, instead of failing the user's call;
    the first attempt here raises deadlock_detected (a sequence, outside the transaction, counts
    the attempts)."""
    import psycopg

    with psycopg.connect(pg_index, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE IF NOT EXISTS test_delete_attempts")
    node = await PgMemory.open(pg_index, quiet_config(), FakeEmbedder(), data_dir=tmp_path)
    try:
        add_session(pg_index, "alice", "k1", ["the garden gate is green"])
        await node.sync_now()
        first_attempt_deadlocks = (
            "DO $$ BEGIN IF nextval('test_delete_attempts') = 1 THEN "
            "RAISE EXCEPTION 'simulated' USING ERRCODE = 'deadlock_detected'; END IF; END $$")
        deleted = await node._delete_chunks("user_id = %(user)s", {"user": "alice"},
                                            first=first_attempt_deadlocks)
        assert deleted == 1 and chunk_rows(pg_index) == []
    finally:
        await node.close()


async def test_recall_widens_a_hit_by_its_neighbours_on_postgres(pg_index: str,
                                                                 tmp_path: Path) -> None:
    """PgMemory.recall, like MemoryService's, brings the message before and after a hit from
    the chunks table when the budget has room."""
    from tests.memory.test_neighbours import MESSAGES

    add_session(pg_index, "alice", "zoo", MESSAGES)
    node = await PgMemory.open(pg_index, quiet_config(chunk_tokens=32, overlap_tokens=0),
                               FakeEmbedder(), data_dir=tmp_path)
    try:
        await node.sync_now()
        recalled = await node.recall("alice", "Rottnest island", k=1)
    finally:
        await node.close()
    assert len(recalled) == 1
    assert [line.split("]: ", 1)[1] for line in recalled[0].content.split("\n")] == MESSAGES[:3]
