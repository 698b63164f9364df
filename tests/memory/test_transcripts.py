"""The writer against the reader: what ``SessionStore`` writes is what the index holds."""

from __future__ import annotations

from pathlib import Path

from sessions import SessionsConfig, SessionStore
from tests.memory.conftest import FakeEmbedder, opened, quiet_config


async def test_store_written_transcripts_are_indexed_and_searchable(tmp_path: Path) -> None:
    """Sessions written through SessionStore — names, extra keys, an empty aborted reply, text
    with surrounding whitespace, a later append — are indexed line for line and found by search."""
    config = quiet_config(chunk_tokens=48, overlap_tokens=8)
    with SessionStore(tmp_path, SessionsConfig(fsync="never")) as store:
        a = store.create("alice", title="trip")
        store.append_message("alice", a.session_key, role="user", content="  We should visit Reykjavik in March.\n",
                             name="Ada", ts="2026-11-22T10:00:00Z")
        store.append_message("alice", a.session_key, role="assistant", content="", run_id="r1",
                             extra={"aborted": True}, ts="2026-11-22T10:00:05Z")
        store.append_message("alice", a.session_key, role="assistant", content="Reykjavik has the northern lights.",
                             run_id="r2", extra={"model": "m", "usage": {"total_tokens": 9}},
                             ts="2026-11-22T10:00:09Z")
        b = store.create("bob")
        store.append_message("bob", b.session_key, role="user", content="Reykjavik is cold", ts="2026-11-22T11:00:00Z")
        async with opened(tmp_path, config, FakeEmbedder()) as svc:
            hits = (await svc.search("alice", "Reykjavik")).results
            assert [h.session_key for h in hits] == [a.session_key]
            (hit,) = hits
            assert hit.content == ("Ada [2026-11-22T10:00:00.000Z]: We should visit Reykjavik in March.\n"
                                   "assistant [2026-11-22T10:00:09.000Z]: Reykjavik has the northern lights.")
            assert (hit.line_start, hit.line_end) == (2, 4)
            assert (hit.start_ts, hit.end_ts) == ("2026-11-22T10:00:00.000Z", "2026-11-22T10:00:09.000Z")
            store.append_message("alice", a.session_key, role="user", content="And the geysers?")
            report = await svc.sync_now()
            assert report.files_changed == 1
            assert [h.line_end for h in (await svc.search("alice", "geysers", mode="keyword")).results] == [5]
            assert await svc.delete_session("bob", b.session_key) == 1
            store.delete("bob", b.session_key)
            await svc.sync_now()
            status = await svc.status()
    assert (status["files"], status["pending"]) == (1, 0)
