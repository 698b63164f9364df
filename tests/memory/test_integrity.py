"""memory.db integrity: cheap checks at open, the full quick_check in the background after start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import apsw
from structlog.testing import capture_logs

from memory.errors import MemoryStorageError, MemoryUnavailable
from memory.sqlite.index.db import IntegrityCheck
from memory.sqlite.service import MemoryService
from tests.memory.conftest import FakeEmbedder, opened, quiet_config, write_transcript

FACTS = [f"note {i}: the heron number {i} nests by the mill pond with reeds and willows"
         for i in range(400)]


async def _indexed(tmp_path: Path) -> int:
    write_transcript(tmp_path, "alice", "s1", FACTS)
    async with opened(tmp_path, quiet_config(chunk_tokens=64, overlap_tokens=0),
                      FakeEmbedder()) as svc:
        chunks = int((await svc.status())["chunks"])
    assert not (tmp_path / "memory.db-wal").exists()  # a clean stop leaves one file
    return chunks


async def _until_rebuilt(svc: MemoryService) -> dict[str, object]:
    async with asyncio.timeout(60):
        while True:
            try:
                status = await svc.status()
            except MemoryUnavailable as exc:  # the moment between closing
                                              # the file and its replacement
                assert "integrity check" in str(exc)
                await asyncio.sleep(0.01)
                continue
            except MemoryStorageError as exc:  # status read the damaged page before the check did
                assert "CorruptError" in str(exc)
                await asyncio.sleep(0.01)
                continue
            if status["rebuiltFromTranscripts"] and not status["syncing"] \
                    and status["pending"] == 0 and status["chunks"]:
                return status
            await asyncio.sleep(0.05)


async def test_truncated_database_is_caught_at_open(tmp_path: Path) -> None:
    """A memory.db cut to a third of its length is refused when it is opened (no full scan
    needed), moved aside and rebuilt from the transcripts; search finds the old facts."""
    chunks = await _indexed(tmp_path)
    db = tmp_path / "memory.db"
    with db.open("r+b") as fh:
        fh.truncate(db.stat().st_size // 3)
    async with opened(tmp_path, quiet_config(chunk_tokens=64, overlap_tokens=0),
                      FakeEmbedder()) as svc:
        status = await _until_rebuilt(svc)
        hits = (await svc.search("alice", "heron number 7", mode="keyword")).results
    assert "moved to" in str(status["rebuiltFromTranscripts"])
    assert "integrity check" not in str(status["rebuiltFromTranscripts"])
    assert status["chunks"] == chunks
    assert len(list(tmp_path.glob("memory.db.corrupt-*"))) == 1
    assert any("heron number 7 " in h.content for h in hits)


def _damage_a_leaf(db_path: Path) -> None:
    """Overwrite one leaf page of the chunks table in the middle of the file: the header and
    schema stay readable, so only a full check notices."""
    db = apsw.Connection(str(db_path))
    (page_size,) = db.execute("PRAGMA page_size").fetchone() or (4096,)
    pages = [p for (p,) in db.execute("SELECT pageno FROM dbstat WHERE name = 'chunks' AND "
                                      "pagetype = 'leaf'")]
    db.close()
    assert len(pages) >= 3
    with db_path.open("r+b") as fh:
        fh.seek((pages[len(pages) // 2] - 1) * page_size)
        fh.write(b"\xa5" * page_size)


async def test_damage_only_a_full_check_sees_is_found_after_start_and_rebuilt(
        tmp_path: Path) -> None:
    """A damaged page that opening does not read: start() serves at once, the background
    quick_check finds it, the file is moved aside and the index rebuilt while the service runs."""
    chunks = await _indexed(tmp_path)
    _damage_a_leaf(tmp_path / "memory.db")
    assert IntegrityCheck(tmp_path / "memory.db").run() is not None
    with capture_logs() as logs:
        async with opened(tmp_path, quiet_config(chunk_tokens=64, overlap_tokens=0),
                          FakeEmbedder()) as svc:
            status = await _until_rebuilt(svc)
            hits = (await svc.search("alice", "heron number 7", mode="hybrid")).results
    assert "failed its integrity check" in str(status["rebuiltFromTranscripts"])
    assert status["chunks"] == chunks
    assert len(list(tmp_path.glob("memory.db.corrupt-*"))) == 1
    assert any("heron number 7 " in h.content for h in hits)
    assert [e for e in logs if e["event"] == "memory.db.corrupt"]
    assert IntegrityCheck(tmp_path / "memory.db").run() is None


async def test_healthy_database_passes_the_background_check(tmp_path: Path) -> None:
    """An intact memory.db passes the background check: nothing is moved aside or rebuilt."""
    await _indexed(tmp_path)
    with capture_logs() as logs:
        async with opened(tmp_path, quiet_config(chunk_tokens=64, overlap_tokens=0),
                          FakeEmbedder()) as svc:
            async with asyncio.timeout(30):
                while not [e for e in logs if e["event"] == "memory.integrity_checked"]:
                    await asyncio.sleep(0.02)
            status = await svc.status()
    assert [e["ok"] for e in logs if e["event"] == "memory.integrity_checked"] == [True]
    assert status["rebuiltFromTranscripts"] is None
    assert not list(tmp_path.glob("memory.db.corrupt-*"))


def test_cancelled_check_reports_nothing_and_holds_no_connection(tmp_path: Path) -> None:
    """A check cancelled before it runs returns None without opening the file."""
    check = IntegrityCheck(tmp_path / "absent.db")
    check.cancel()
    assert check.run() is None
    assert not (tmp_path / "absent.db").exists()
