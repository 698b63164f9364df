"""Indexing: incremental appends, rewrites, deletes, the embedding cache, failures and recovery."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from memory import MemoryConfig
from memory.sqlite.service import MemoryService
from tests.memory.conftest import (
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    embedder_down,
    message_line,
    opened,
    quiet_config,
    session_key,
    write_transcript,
)

SMALL = {"chunk_tokens": 64, "overlap_tokens": 16}


def sentences(n: int, topic: str = "topic", start: int = 0) -> list[str]:
    return [f"sentence {start + i} about {topic} number {start + i} with some filler words"
            for i in range(n)]


def chunk_rows(data_dir: Path) -> list[tuple[str, int, int, int, str]]:
    """The chunks of the SQLite index in ``data_dir`` (see :meth:`MemoryBackend.chunk_rows`)."""
    return MemoryBackend("sqlite", data_dir).chunk_rows()


async def test_append_reindexes_only_the_tail(memory_backend: MemoryBackend) -> None:
    """An append writes only the last open chunk and the new ones, and embeds only those."""
    embedder = FakeEmbedder()
    memory_backend.write("alice", "s1", sentences(60))
    async with memory_backend.opened(quiet_config(**SMALL), embedder) as svc:
        assert (await svc.status())["chunks"] > 20  # indexed by the start-up catch-up
        embedder.calls.clear()
        memory_backend.append("alice", "s1", sentences(2, start=60), start_minute=60)
        second = await svc.sync_now()
        assert 1 <= second.chunks_written <= 3
        assert second.chunks_deleted <= 1
        assert len(embedder.texts) == second.chunks_written
        quiet = await svc.sync_now()
        assert quiet.chunks_written == 0 and quiet.files_changed == 0
    # The incremental result equals indexing the final session from scratch.
    fresh = memory_backend.another()
    fresh.write("alice", "s1", sentences(62))
    async with fresh.opened(quiet_config(**SMALL), FakeEmbedder()) as svc:
        await svc.sync_now()
    assert [r[1:] for r in memory_backend.chunk_rows()] == [r[1:] for r in fresh.chunk_rows()]


async def test_partial_trailing_line_waits_until_complete(tmp_path: Path,
                                                          service: MemoryService) -> None:
    """A last line without its newline is not indexed until the newline arrives."""
    path = write_transcript(tmp_path, "alice", "s1", ["first message about apples"])
    await service.sync_now()
    line = message_line("zebra crossing mentioned here", minute=5)
    with path.open("ab") as fh:
        fh.write(line[:-10])
    await service.sync_now()
    assert (await service.search("alice", "zebra", mode="keyword")).results == []
    with path.open("ab") as fh:
        fh.write(line[-10:])
    await service.sync_now()
    hits = (await service.search("alice", "zebra", mode="keyword")).results
    assert len(hits) == 1 and hits[0].line_end == 3


async def test_rewritten_file_is_reindexed_whole(memory_backend: MemoryBackend,
                                                 memory_service: BackendMemory) -> None:
    """A session whose indexed prefix changed (its file rewritten; on PostgreSQL deleted and
    created again under its key) is re-indexed from the start; old text disappears."""
    memory_backend.write("alice", "s1", ["we talked about kangaroos", "yes kangaroos"])
    await memory_service.sync_now()
    memory_backend.write("alice", "s1",
                         ["now the talk is about penguins", "penguins indeed", "more"])
    await memory_service.sync_now()
    assert (await memory_service.search("alice", "kangaroos", mode="keyword")).results == []
    assert len((await memory_service.search("alice", "penguins", mode="keyword")).results) == 1


async def test_truncated_file_is_reindexed(tmp_path: Path, service: MemoryService) -> None:
    """A file cut shorter than its indexed offset loses the rows of the removed text."""
    path = write_transcript(tmp_path, "alice", "s1", ["alpha message", "omega message"])
    await service.sync_now()
    data = path.read_bytes()
    path.write_bytes(data[: data.rindex(b"\n", 0, data.index(b"omega")) + 1])
    await service.sync_now()
    assert (await service.search("alice", "omega", mode="keyword")).results == []
    assert len((await service.search("alice", "alpha", mode="keyword")).results) == 1


async def test_deleted_file_and_delete_session_leave_no_rows(memory_backend: MemoryBackend,
                                                             memory_service: BackendMemory) -> None:
    """A deleted session loses its rows on sync; delete_session removes rows at once."""
    memory_backend.write("alice", "s1", ["walrus facts"])
    memory_backend.write("alice", "s2", ["walrus opinions"])
    await memory_service.sync_now()
    memory_backend.delete("alice", "s1")
    report = await memory_service.sync_now()
    assert report.files_deleted == 1
    assert await memory_service.delete_session("alice", session_key("s2")) == 1
    assert (await memory_service.search("alice", "walrus")).results == []
    status = await memory_service.status()
    assert (status["files"], status["chunks"]) == (0, 0)


async def test_cache_survives_restart_and_full_reindex(memory_backend: MemoryBackend) -> None:
    """A second service on the same data, even after a full re-index, calls the embedder
    zero times."""
    memory_backend.write("alice", "s1", sentences(30))
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder()) as svc:
        await svc.sync_now()
    second = FakeEmbedder()
    async with memory_backend.opened(quiet_config(**SMALL), second) as svc:
        await svc.sync_now()
        await svc.reindex(full=True)
        await svc.sync_now()
        status = await svc.status()
    assert second.calls == []
    assert status["pending"] == 0 and status["embedded"] == status["chunks"]


async def test_same_text_in_another_session_is_not_reembedded(memory_backend: MemoryBackend,
                                                              memory_service: BackendMemory,
                                                              embedder: FakeEmbedder) -> None:
    """The same chunk text in a second session comes from the cache and is stored once."""
    memory_backend.write("alice", "s1", ["identical words here"])
    await memory_service.sync_now()
    embedder.calls.clear()
    memory_backend.write("alice", "s2", ["identical words here"])
    report = await memory_service.sync_now()
    assert embedder.calls == [] and report.cache_hits == 1
    status = await memory_service.status()
    assert (status["chunks"], status["embedded"], status["cacheEntries"]) == (2, 2, 1)


async def test_embedder_failure_leaves_chunks_pending_then_recovers(memory_backend: MemoryBackend,
                                                                   memory_service: BackendMemory,
                                                                   embedder: FakeEmbedder) -> None:
    """When the embedder fails, chunks stay pending and keyword-searchable; a later sync
    embeds them."""
    embedder.fail = embedder_down()
    memory_backend.write("alice", "s1", ["the capybara is calm"])
    report = await memory_service.sync_now()
    assert report.pending == 1 and report.error and "503" in report.error
    status = await memory_service.status()
    assert status["pending"] == 1 and "503" in status["lastError"]
    response = await memory_service.search("alice", "capybara")
    assert response.mode == "keyword" and response.fallback_reason
    assert [h.keyword_rank for h in response.results] == [1]
    embedder.fail = None
    report = await memory_service.sync_now()
    assert report.pending == 0 and report.embedded == 1
    assert (await memory_service.status())["lastError"] is None
    response = await memory_service.search("alice", "capybara")
    assert response.mode == "hybrid" and response.results[0].vector_rank == 1


class FailsAfter(FakeEmbedder):
    """Answers its first ``good`` calls, then fails every call."""

    def __init__(self, good: int, *, batch_size: int) -> None:
        super().__init__(batch_size=batch_size)
        self.good = good

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        if len(self.calls) >= self.good:
            self.fail = embedder_down()
        return await super().embed(texts, kind)


async def test_each_embedder_call_is_committed_before_the_next(
        memory_backend: MemoryBackend) -> None:
    """The vectors of every embedder call that answered are stored even when a later call of the
    same sync fails (and the cached vectors with them): a slow local backfill shows progress and
    keeps it."""
    memory_backend.write("alice", "s0", ["a text the cache will hold"])
    async with memory_backend.opened(quiet_config(), FakeEmbedder(batch_size=2)) as svc:
        assert (await svc.status())["embedded"] == 1
    for i in range(3):
        memory_backend.write("alice", f"s{i + 1}",
                             [f"session {i} talks about {w}" for w in ("owls", "tea")])
    memory_backend.write("alice", "s4", ["a text the cache will hold"])
    embedder = FailsAfter(1, batch_size=2)
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        status = await svc.status()
        assert len(embedder.calls) == 2 and len(embedder.calls[0]) == 2
        # s0, the first call's two chunks and s4's cached one; the call that failed left its
        # chunk pending.
        assert (status["chunks"], status["embedded"], status["pending"]) == (5, 4, 1)
        assert "503" in status["lastError"]


async def test_sqlite_vec_load_failure_runs_keyword_only(tmp_path: Path) -> None:
    """If sqlite-vec cannot load, indexing and search still work keyword-only and status
    says why."""
    write_transcript(tmp_path, "alice", "s1", ["an otter holds hands"])
    with capture_logs() as logs:
        async with opened(tmp_path, quiet_config(), FakeEmbedder(),
                                 vec_extension=str(tmp_path / "no-such-vec0")) as svc:
            await svc.sync_now()
            status = await svc.status()
            response = await svc.search("alice", "otter")
    assert status["vectorBackend"]["available"] is False
    assert "sqlite-vec failed to load" in status["vectorBackend"]["reason"]
    assert response.mode == "keyword" and "sqlite-vec" in (response.fallback_reason or "")
    assert len(response.results) == 1
    assert any(e["event"] == "memory.vector_backend.unavailable" and e["log_level"] == "warning"
               for e in logs)


async def test_vectors_rebuilt_after_running_without_sqlite_vec(tmp_path: Path) -> None:
    """Rows changed while sqlite-vec was missing leave no stale vectors once it loads again."""
    write_transcript(tmp_path, "alice", "s1", ["first topic: hedgehogs"])
    async with opened(tmp_path, quiet_config(), FakeEmbedder()) as svc:
        await svc.sync_now()
    write_transcript(tmp_path, "alice", "s1", ["second topic: hamsters"])
    async with opened(tmp_path, quiet_config(), FakeEmbedder(), vec_extension=None) as svc:
        await svc.sync_now()
    async with opened(tmp_path, quiet_config(), FakeEmbedder()) as svc:
        await svc.sync_now()
        response = await svc.search("alice", "hedgehogs", mode="vector")
        status = await svc.status()
    assert response.mode == "vector"
    assert [h.content for h in response.results] == [r[4] for r in chunk_rows(tmp_path)]
    assert status["embedded"] == status["chunks"] == 1


async def test_corrupt_database_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    """A memory.db that is not a database is moved aside, recreated, and refilled from
    transcripts."""
    write_transcript(tmp_path, "alice", "s1", ["the ibis wades"])
    (tmp_path / "memory.db").write_bytes(b"this is not an sqlite database at all" * 200)
    async with opened(tmp_path, quiet_config(), FakeEmbedder()) as svc:
        await svc.sync_now()
        status = await svc.status()
        hits = (await svc.search("alice", "ibis")).results
    assert status["rebuiltFromTranscripts"] and "moved to" in status["rebuiltFromTranscripts"]
    assert list(tmp_path.glob("memory.db.corrupt-*"))
    assert len(hits) == 1


async def test_embedder_change_rebuilds_vectors_without_mixing(
        memory_backend: MemoryBackend) -> None:
    """A new embedder identity clears old vectors at once; hybrid is keyword-only until rebuilt."""
    memory_backend.write("alice", "s1", ["the lynx stalks quietly"])
    async with memory_backend.opened(quiet_config(), FakeEmbedder(model_id="model-a")) as svc:
        await svc.sync_now()
    other = FakeEmbedder(dims=32, model_id="model-b")
    other.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), other) as svc:
        await svc.sync_now()
        during = await svc.search("alice", "lynx")
        other.fail = None
        await svc.sync_now()
        after = await svc.search("alice", "lynx")
    assert during.mode == "keyword" and "rebuilt" in (during.fallback_reason or "")
    assert after.mode == "hybrid" and after.results[0].vector_rank == 1
    # Switching back reuses model-a's cached vectors.
    back = FakeEmbedder(model_id="model-a")
    async with memory_backend.opened(quiet_config(), back) as svc:
        await svc.sync_now()
        assert (await svc.search("alice", "lynx")).mode == "hybrid"
    assert back.calls == [["the lynx stalks quietly"]] or all(len(c) == 1 for c in back.calls)


async def test_chunk_setting_change_reindexes(memory_backend: MemoryBackend) -> None:
    """Changing chunk sizes re-chunks every transcript with the new settings."""
    memory_backend.write("alice", "s1", sentences(40))
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        await svc.sync_now()
    big = len(memory_backend.chunk_rows())
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder()) as svc:
        await svc.sync_now()
        status = await svc.status()
    assert len(memory_backend.chunk_rows()) > big and status["pending"] == 0


async def test_automatic_chunks_fit_the_embedders_window(memory_backend: MemoryBackend) -> None:
    """With chunk_tokens unset, chunks are sized to 4/5 of the embedder's window, so none
    is cut off."""
    from memory.chunking import approx_tokens

    embedder = FakeEmbedder()
    embedder.max_tokens = 40
    memory_backend.write("alice", "s1", [" ".join(f"word{i}" for i in range(30)) for _ in range(6)])
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        await svc.sync_now()
    contents = [row[4] for row in memory_backend.chunk_rows()]
    assert len(contents) > 6   # 6 long messages had to be cut to fit
    assert all(approx_tokens(c) <= 32 + 8 for c in contents)   # 32 = 4/5 of 40; 8: one prefix
    assert MemoryConfig().sized_for(None).chunk_tokens == 256
    assert MemoryConfig().sized_for(512).chunk_tokens == 256
    assert MemoryConfig().sized_for(200).chunk_tokens == 160
    assert MemoryConfig(chunk_tokens=300).sized_for(128).chunk_tokens == 300  # set explicitly: kept


async def test_vectors_are_stored_while_another_thread_writes(tmp_path: Path) -> None:
    """Storing vectors waits for the writing connection's lock; it used to read the
    connection's file name before taking it, which apsw refuses while another thread runs a
    statement ("Connection is busy in another thread": a failed catch-up sync in CI)."""
    import asyncio
    import threading

    class GatedEmbedder(FakeEmbedder):
        async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
            embedding.set()
            await proceed.wait()
            return await super().embed(texts, kind)

    embedding, proceed = asyncio.Event(), asyncio.Event()
    write_transcript(tmp_path, "alice", "s1", ["the capybara is calm"])
    svc = MemoryService(tmp_path, quiet_config(), GatedEmbedder())
    await svc.start(catch_up=False)
    try:
        conn = svc._require_index().conn
        busy, release = threading.Event(), threading.Event()

        def long_write() -> None:
            # Another writer (an episode, a fact) holding the lock, inside a statement: apsw marks
            # a connection busy only while a call into SQLite runs, so the statement waits in SQL.
            def hold(*_: object) -> int:
                busy.set()
                release.wait(30)
                return 1

            with conn.lock:
                conn.db.create_scalar_function("test_hold", hold, 0)
                conn.db.execute("SELECT test_hold()").fetchall()

        syncing = asyncio.create_task(svc.sync_now())
        async with asyncio.timeout(30):
            await embedding.wait()  # the sync is between its chunk rows and storing their vectors
            writer = asyncio.create_task(asyncio.to_thread(long_write))
            await asyncio.to_thread(busy.wait, 30)
            proceed.set()
            await asyncio.sleep(0.3)  # the store step reaches the connection while the writer runs
            release.set()
            await writer
            report = await syncing
        assert report.error is None and report.embedded == 1 and report.pending == 0
    finally:
        await svc.close()


async def test_a_failed_catch_up_sync_is_retried_without_a_new_message(tmp_path: Path) -> None:
    """A catch-up sync that fails (here: the disk below the free-space floor) is retried on its
    own, so once space comes back an idle daemon indexes its transcripts with no new message."""
    import asyncio

    write_transcript(tmp_path, "alice", "s1", ["the capybara is calm"])
    svc = MemoryService(tmp_path, quiet_config(sync_retry_s=0.1), FakeEmbedder(),
                        min_free_bytes=1 << 60)
    await svc.start()
    try:
        async with asyncio.timeout(30):
            while "disk almost full" not in ((await svc.status())["lastError"] or ""):
                await asyncio.sleep(0.02)
            svc._require_index().conn.min_free_bytes = 0  # space comes back
            while (status := await svc.status())["chunks"] == 0 or status["lastError"]:
                await asyncio.sleep(0.05)
        assert status["pending"] == 0 and status["embedded"] == 1
        assert len((await svc.search("alice", "capybara")).results) == 1
    finally:
        await svc.close()
