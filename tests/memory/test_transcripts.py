"""The writer against the reader: what ``SessionStore`` writes is what the index holds."""

from __future__ import annotations

import shutil
from pathlib import Path

from structlog.testing import capture_logs

from sessions import (
    SessionsConfig,
    SessionStore,
    sessions_root,
    transcript_file,
    transcript_relpath,
)
from tests.memory.conftest import FakeEmbedder, MemoryBackend, opened, quiet_config


async def test_store_written_transcripts_are_indexed_and_searchable(
        memory_backend: MemoryBackend) -> None:
    """Sessions written through the sessions store — names, extra keys, an empty aborted reply, text
    with surrounding whitespace, a later append — are indexed line for line and found by search."""
    config = quiet_config(chunk_tokens=48, overlap_tokens=8)
    with memory_backend.sessions_store() as store:
        a = store.create("alice", title="trip")
        store.append_message("alice", a.session_key, role="user",
                             content="  We should visit Reykjavik in March.\n",
                             name="Ada", ts="2026-11-22T10:00:00Z")
        store.append_message("alice", a.session_key, role="assistant", content="", run_id="r1",
                             extra={"aborted": True}, ts="2026-11-22T10:00:05Z")
        store.append_message("alice", a.session_key, role="assistant",
                             content="Reykjavik has the northern lights.",
                             run_id="r2", extra={"model": "m", "usage": {"total_tokens": 9}},
                             ts="2026-11-22T10:00:09Z")
        b = store.create("bob")
        store.append_message("bob", b.session_key, role="user", content="Reykjavik is cold",
                             ts="2026-11-22T11:00:00Z")
        async with memory_backend.opened(config, FakeEmbedder()) as svc:
            hits = (await svc.search("alice", "Reykjavik")).results
            assert [h.session_key for h in hits] == [a.session_key]
            (hit,) = hits
            assert hit.content == (
                "Ada [2026-11-22T10:00:00.000Z]: We should visit Reykjavik in March.\n"
                "assistant [2026-11-22T10:00:09.000Z]: Reykjavik has the northern lights.")
            assert (hit.line_start, hit.line_end) == (2, 4)
            assert ((hit.start_ts, hit.end_ts)
                    == ("2026-11-22T10:00:00.000Z", "2026-11-22T10:00:09.000Z"))
            store.append_message("alice", a.session_key, role="user", content="And the geysers?")
            report = await svc.sync_now()
            assert report.files_changed == 1
            assert [h.line_end for h in
                    (await svc.search("alice", "geysers", mode="keyword")).results] == [5]
            assert await svc.delete_session("bob", b.session_key) == 1
            store.delete("bob", b.session_key)
            await svc.sync_now()
            status = await svc.status()
    assert (status["files"], status["pending"]) == (1, 0)


async def test_the_header_the_store_wrote_is_the_one_the_indexer_checks(tmp_path: Path) -> None:
    """The indexer reads a transcript's header with the sessions package's reader: a
    SessionStore-written transcript is indexed, an incognito one is not, and the same bytes
    under another user's directory or another session's file name, or with a header version
    the store would not read, are skipped with the reason and never searchable."""
    with SessionStore(tmp_path, SessionsConfig(fsync="never")) as store:
        plain = store.create("alice", title="plain")
        store.append_message("alice", plain.session_key, role="user",
                             content="The lighthouse key hangs by the stove.")
        secret = store.create("alice", title="secret", memory=False)
        store.append_message("alice", secret.session_key, role="user",
                             content="The lighthouse ghost is a secret.")
        source = store.transcript_path("alice", plain.session_key)
    root = sessions_root(tmp_path)
    other_user = transcript_file(root, "bob", plain.session_key)
    other_key = transcript_file(root, "alice", "f" * 32)
    other_version = transcript_file(root, "alice", "e" * 32)
    other_user.parent.mkdir(mode=0o700)
    shutil.copy(source, other_user)
    shutil.copy(source, other_key)
    other_version.write_bytes(source.read_bytes()
                              .replace(plain.session_key.encode(), other_version.stem.encode())
                              .replace(b'"version":1', b'"version":2', 1))
    with capture_logs() as logs:
        async with opened(tmp_path, quiet_config(), FakeEmbedder()) as svc:
            alice = [h.session_key for h in (await svc.search("alice", "lighthouse")).results]
            bob = (await svc.search("bob", "lighthouse")).results
            status = await svc.status()
    assert alice == [plain.session_key]
    assert bob == []
    reasons = {e["path"]: e["reason"] for e in logs if e["event"] == "memory.file_skipped"}
    misplaced = "its header names another user or session than its path"
    assert reasons == {
        transcript_relpath("bob", plain.session_key): misplaced,
        transcript_relpath("alice", "f" * 32): misplaced,
        transcript_relpath("alice", "e" * 32): "the first line is not a transcript header",
    }
    assert status["skippedFiles"] == 3
