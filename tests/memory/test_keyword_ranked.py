"""The keyword leg of a one-owner database ranks the FTS rows alone and must equal the join."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory.retrieval.request import SearchRequest, fts_terms
from memory.sqlite.index.db import open_index
from memory.sqlite.search import HybridSearch
from memory.sqlite.service import MemoryService
from tests.memory.conftest import (
    FakeEmbedder,
    opened,
    quiet_config,
    session_key,
    ts,
    write_transcript,
)

WORDS = "otter heron marmot badger lynx ibis"


def _write_many(data_dir: Path, user: str, sessions: int, per_session: int) -> None:
    for s in range(sessions):
        write_transcript(data_dir, user, f"s{s}", [
            f"{WORDS.split()[(s + i) % 6]} note {i} of session {s}, "
            + " ".join(WORDS.split()[: 1 + (i % 6)])
            for i in range(per_session)], start_minute=s * 100)


def _legs(data_dir: Path, user: str, query: str,  # type: ignore[return]  # apsw's `with db` may swallow
          **filters: object) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
    """The keyword leg, the joined statement's list, and how often the leg fell back to the join."""
    config = quiet_config(chunk_tokens=16, overlap_tokens=0, candidates=12, max_k=12, default_k=6)
    db = open_index(data_dir / "memory.db", readonly=True).db
    try:
        search = HybridSearch(db, config)
        request = SearchRequest.build(config, user, query, mode="keyword", **filters)  # type: ignore[arg-type]
        match = " OR ".join(fts_terms(query, config.max_query_terms))
        joined = search._joined_keyword_leg
        calls = []

        def counted(*args: object) -> list[tuple[int, float]]:
            calls.append(args)
            return joined(*args)  # type: ignore[arg-type]

        search._joined_keyword_leg = counted  # type: ignore[method-assign,assignment]
        with db:
            leg = search._keyword_leg(request, match)
            return leg, joined(request, match), len(calls)
    finally:
        db.close()


@pytest.mark.parametrize(("filters", "joins"), [
    ({}, 0),
    ({"exclude_session_key": "s0"}, 0),   # a small share of the best matches:
                                          # the ranked list is enough
    ({"exclude_session_key": "s9"}, 0),   # 9 of the 24 ranked: the 15 left are enough
    ({"exclude_session_key": "mid"}, 1),  # the best 15 of the 24 ranked: 9 left is short of 12
    ({"session_key": "s3"}, 1),           # narrowing filters always take the join
    ({"after": ts(400)}, 1),
])
async def test_one_owner_keyword_leg_equals_the_join(tmp_path: Path, filters: dict[str, str],
                                                     joins: int) -> None:
    """With every chunk one user's, the keyword leg returns exactly the joined statement's list,
    from the FTS ranking alone unless a filter or an exclusion leaving too few needs the join."""
    _write_many(tmp_path, "alice", sessions=10, per_session=6)
    write_transcript(tmp_path, "alice", "s9", [f"lynx lynx lynx ibis {i}" for i in range(40)],
                     start_minute=2000)
    write_transcript(tmp_path, "alice", "mid",
                     [f"lynx lynx lynx lynx ibis ibis otter {i}" for i in range(15)],
                     start_minute=3000)
    # equal BM25: ties by id
    write_transcript(tmp_path, "alice", "twins", ["otter"] * 30, start_minute=4000)
    config = quiet_config(chunk_tokens=16, overlap_tokens=0, candidates=12, max_k=12, default_k=6)
    async with opened(tmp_path, config, FakeEmbedder()):
        pass
    resolved = {k: (session_key(v) if k.endswith("session_key") else v) for k, v in filters.items()}
    ranked, joined, used_join = _legs(tmp_path, "alice", "lynx ibis otter", **resolved)
    assert len(joined) == (11 if filters.get("session_key") else 12)
    assert ranked == joined
    assert used_join == joins


async def test_a_second_owner_keeps_the_join_and_the_scope(tmp_path: Path) -> None:
    """Once another user has chunks, alice's keyword leg never returns bob's, and someone with
    no chunks in a one-owner database gets nothing."""
    _write_many(tmp_path, "alice", sessions=3, per_session=4)
    config = quiet_config(chunk_tokens=16, overlap_tokens=0, candidates=12, max_k=12, default_k=6)
    async with opened(tmp_path, config, FakeEmbedder()):
        pass
    assert _legs(tmp_path, "carol", "lynx")[:1] == ([],)
    write_transcript(tmp_path, "bob", "b1", ["lynx lynx lynx lynx"])
    async with opened(tmp_path, config, FakeEmbedder()) as svc:
        hits = (await svc.search("alice", "lynx", mode="keyword")).results
        bob = (await svc.search("bob", "lynx", mode="keyword")).results
    assert hits and all("lynx lynx lynx lynx" not in h.content for h in hits)
    assert [h.content.split(": ", 1)[-1] for h in bob] == ["lynx lynx lynx lynx"]


async def test_readers_map_the_file_only_when_configured(tmp_path: Path) -> None:
    """memory.read_mmap_mb sets the read connections' mapping; the default maps nothing (RSS)."""
    def mapped(svc: MemoryService) -> int:
        assert svc._index is not None
        return int(svc._index.readers.run(lambda db: db.execute("PRAGMA mmap_size").fetchone()[0]))  # type: ignore[index]

    async with opened(tmp_path, quiet_config(), None) as svc:
        assert mapped(svc) == 0
    async with opened(tmp_path, quiet_config(read_mmap_mb=64), None) as svc:
        assert mapped(svc) == 64 << 20
