"""An embedder change on PostgreSQL: the previous model's vectors, kept in their own column, serve
the vector leg until the rebuild ends, on every node, and are let go of at its end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg

from memory.errors import EmbedderError
from memory.pg.service import PgMemory
from tests.memory.conftest import embedder_down, quiet_config
from tests.memory.pg.conftest import add_session, key_of
from tests.memory.test_rebuild_serving import (
    BREAD,
    LYNX,
    SynonymEmbedder,
    content_of,
    factory_of,
    model_a,
    model_b,
)


@contextlib.asynccontextmanager
async def node(dsn: str, tmp_path: Path, embedder: Any, *, sync: bool = True,
               **kwargs: Any) -> AsyncIterator[PgMemory]:
    """A node over ``dsn``, after one pass of its own unless ``sync`` is False."""
    memory = await PgMemory.open(dsn, quiet_config(), embedder, data_dir=tmp_path, **kwargs)
    try:
        if sync:
            with contextlib.suppress(EmbedderError):
                await memory.sync_now()
        yield memory
    finally:
        await memory.close()


def kept(dsn: str) -> tuple[int, dict[str, str]]:
    """Chunks holding a previous vector, and the rebuild's meta keys."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(embedding_previous) FROM recalld_memory_chunks").fetchone()
        meta = {str(k): str(v) for k, v in conn.execute(
            "SELECT key, value FROM recalld_memory_meta WHERE key IN "
            "('vector_rebuild', 'embedder_previous', 'vector_dims_previous')").fetchall()}
    assert row is not None
    return int(row[0]), meta


async def indexed_with_a(dsn: str, tmp_path: Path) -> None:
    add_session(dsn, "alice", "s1", [LYNX])
    add_session(dsn, "alice", "s2", [BREAD], start_minute=600)
    async with node(dsn, tmp_path, model_a()) as memory:
        assert (await memory.status())["pending"] == 0


async def test_the_end_of_the_rebuild_lets_go_of_the_previous_vectors(pg_index: str,
                                                                      tmp_path: Path) -> None:
    """Mid-rebuild the previous vectors and their identity are kept in the database; the pass
    that embeds the last chunk removes both, and the new model's vectors answer."""
    await indexed_with_a(pg_index, tmp_path)
    new = model_b()
    new.fail = embedder_down()
    async with node(pg_index, tmp_path, new, previous_embedder=factory_of(model_a())) as memory:
        during = await memory.search("alice", "wildcat")
        mid = kept(pg_index)
        new.fail = None
        await memory.sync_now()
        after = await memory.search("alice", "wildcat")
        status = await memory.status()
    assert during.previous_model == "model-a" and content_of(during.results[0]) == LYNX
    assert mid == (2, {"vector_rebuild": "1", "embedder_previous": '["fake", "model-a", "none"]',
                       "vector_dims_previous": "64"})
    assert after.previous_model is None and after.fallback_reason is None
    assert content_of(after.results[0]) == BREAD and after.results[0].vector_rank == 1
    assert status["vectorSearch"] == {"ready": True, "reason": None, "rebuild": None,
                                      "servedBy": {"provider": "fake", "model": "model-b"}}
    assert kept(pg_index) == (0, {})


async def test_a_chunk_cut_again_mid_rebuild_has_no_previous_vector(pg_index: str,
                                                                    tmp_path: Path) -> None:
    """A chunk whose text changes during the rebuild loses its previous vector (it was the old
    text's), while the chunks left as they were keep theirs."""
    await indexed_with_a(pg_index, tmp_path)
    new = model_b()
    new.fail = embedder_down()
    async with node(pg_index, tmp_path, new, previous_embedder=factory_of(model_a())) as memory:
        add_session(pg_index, "alice", "s1", ["a lynx kitten naps in the barn"], start_minute=5,
                    create=False)
        with contextlib.suppress(EmbedderError):
            await memory.sync_now()
        hits = (await memory.search("alice", "lynx")).results
    with psycopg.connect(pg_index) as conn:
        previous = {str(k): bool(v) for k, v in conn.execute(
            "SELECT session_key, bool_and(embedding_previous IS NOT NULL) "
            "FROM recalld_memory_chunks GROUP BY session_key").fetchall()}
    assert previous == {key_of("s1"): False, key_of("s2"): True}
    s1 = next(h for h in hits if "kitten" in h.content)
    assert s1.keyword_rank is not None and s1.vector_rank is None and s1.similarity is None


async def test_every_node_serves_the_previous_model_and_sees_the_rebuild_end(
        pg_index: str, tmp_path: Path) -> None:
    """A node opened after another started the rebuild serves the previous model at once, without
    a pass of its own; once the other ends the rebuild, its next pass reads that, and the new
    model's vectors answer there too."""
    await indexed_with_a(pg_index, tmp_path)
    first_model, second_model = model_b(), model_b()
    first_model.fail = second_model.fail = embedder_down()
    async with node(pg_index, tmp_path, first_model,
                    previous_embedder=factory_of(model_a())) as first, \
            node(pg_index, tmp_path, second_model, sync=False,
                 previous_embedder=factory_of(model_a())) as second:
        at_open = await second.search("alice", "wildcat")
        first_model.fail = None
        await first.sync_now()
        before_its_pass = await second.search("alice", "wildcat")
        second_model.fail = None
        await second.sync_now()
        after_its_pass = await second.search("alice", "wildcat")
    assert at_open.previous_model == "model-a" and content_of(at_open.results[0]) == LYNX
    assert before_its_pass.previous_model == "model-a"   # read at its passes, as documented
    assert after_its_pass.previous_model is None and after_its_pass.mode == "hybrid"
    assert content_of(after_its_pass.results[0]) == BREAD


class HeldModel(SynonymEmbedder):
    """model-b, whose passage calls wait for ``go``: a pass's rebuild stays in its embedding."""

    def __init__(self) -> None:
        super().__init__("model-b", {"wildcat": "bread flour"}, dims=32)
        self.embedding = asyncio.Event()
        self.go = asyncio.Event()

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        if kind == "passage":
            self.embedding.set()
            await self.go.wait()
        return await super().embed(texts, kind)


async def test_the_previous_model_serves_during_the_pass_that_rebuilds(pg_index: str,
                                                                       tmp_path: Path) -> None:
    """A node restarted with a new model serves the previous model while its own first pass is
    still embedding (the change is made, and read, before the pass's rebuild)."""
    await indexed_with_a(pg_index, tmp_path)
    new = HeldModel()
    async with node(pg_index, tmp_path, new, sync=False,
                    previous_embedder=factory_of(model_a())) as memory:
        rebuilding = asyncio.create_task(memory.sync_now())
        await asyncio.wait_for(new.embedding.wait(), 30)
        during = await memory.search("alice", "wildcat")
        new.go.set()
        await asyncio.wait_for(rebuilding, 30)
        after = await memory.search("alice", "wildcat")
    assert during.previous_model == "model-a" and content_of(during.results[0]) == LYNX
    assert after.previous_model is None and content_of(after.results[0]) == BREAD


async def test_the_change_is_not_cut_by_the_statement_timeout(pg_index: str,
                                                              tmp_path: Path) -> None:
    """The one statement that moves every vector at an embedder change runs past the pool's
    statement timeout (a large index): the rebuild starts, at the first pass."""
    await indexed_with_a(pg_index, tmp_path)
    with psycopg.connect(pg_index, autocommit=True) as conn:
        # Stands in for a table too large to rewrite within the timeout: each row takes 30 ms.
        conn.execute("CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER slow_rows BEFORE UPDATE OF embedding "
                     "ON recalld_memory_chunks FOR EACH ROW EXECUTE FUNCTION slow_row()")
    new = model_b()
    new.fail = embedder_down()
    async with node(pg_index, tmp_path, new, previous_embedder=factory_of(model_a()),
                    options="-c statement_timeout=40") as memory:
        status = await memory.status()
        during = await memory.search("alice", "wildcat")
    assert status["vectorSearch"]["rebuild"] is not None
    assert during.previous_model == "model-a"
    assert kept(pg_index)[0] == 2


def stored_embedder(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT value FROM recalld_memory_meta "
                           "WHERE key = 'embedder'").fetchone()
    assert row is not None
    return str(row[0])


async def test_a_node_started_earlier_leaves_a_later_nodes_change(pg_index: str,
                                                                 tmp_path: Path) -> None:
    """During a rolling restart to a new embedder, a node still on the old one does not change it
    back at its passes: its queries rank against its own model's earlier vectors while the
    rebuild runs, then its hybrid search is keyword-only, saying why each time."""
    await indexed_with_a(pg_index, tmp_path)
    new = model_b()
    new.fail = embedder_down()
    async with node(pg_index, tmp_path, model_a()) as old:
        async with node(pg_index, tmp_path, new, previous_embedder=factory_of(model_a())) as later:
            await old.sync_now()
            assert stored_embedder(pg_index) == '["fake", "model-b", "none"]'
            assert kept(pg_index)[0] == 2   # old's vectors were not thrown away again
            during = await old.search("alice", "wildcat")
            status = (await old.status())["vectorSearch"]
            new.fail = None
            await later.sync_now()
            await old.sync_now()
            after = await old.search("alice", "wildcat")
            served = await later.search("alice", "wildcat")
    assert during.mode == "hybrid" and during.previous_model is None
    assert content_of(during.results[0]) == LYNX and during.results[0].vector_rank == 1
    assert during.fallback_reason is not None and "fake model-b" in during.fallback_reason
    assert status == {"ready": False, "reason": during.fallback_reason, "rebuild": None,
                      "servedBy": {"provider": "fake", "model": "model-a"}}
    assert after.mode == "keyword" and after.fallback_reason is not None
    assert "keyword-only" in after.fallback_reason and "restart this node" in after.fallback_reason
    assert stored_embedder(pg_index) == '["fake", "model-b", "none"]'
    assert served.mode == "hybrid" and content_of(served.results[0]) == BREAD


async def test_the_node_started_last_decides(pg_index: str, tmp_path: Path) -> None:
    """A node restarted with the old embedder after the change makes it the cluster's again (the
    newest start wins), and the node of the other setting, still running, leaves it so."""
    await indexed_with_a(pg_index, tmp_path)
    async with node(pg_index, tmp_path, model_b()) as newer:
        assert stored_embedder(pg_index) == '["fake", "model-b", "none"]'
        async with node(pg_index, tmp_path, model_a()) as rolled_back:
            await newer.sync_now()
            await rolled_back.sync_now()
            hits = await rolled_back.search("alice", "wildcat")
            status = await newer.status()
    assert stored_embedder(pg_index) == '["fake", "model-a", "none"]'
    assert hits.fallback_reason is None and content_of(hits.results[0]) == LYNX
    assert not status["vectorSearch"]["ready"]
    assert "fake model-a" in status["vectorSearch"]["reason"]


async def test_a_command_records_an_embedder_only_where_none_is(pg_index: str) -> None:
    """A CLI command's first build (record_first) writes its identity where no row or the ''
    of a node without an embedder is, in one statement, and leaves a recorded one as it is (a
    node that recorded its own a moment before is never replaced)."""
    from memory.embedders.previous import EmbedderIdentity
    from memory.pg.vectors import record_first

    a, b = EmbedderIdentity("fake", "model-a", "none"), EmbedderIdentity("fake", "model-b", "none")
    async with await psycopg.AsyncConnection.connect(pg_index, autocommit=True) as conn:
        first = await record_first(conn, a)
        second = await record_first(conn, b)
        kept_a = stored_embedder(pg_index)
        await conn.execute("UPDATE recalld_memory_meta SET value = '' WHERE key = 'embedder'")
        third = await record_first(conn, b)
    assert (first, second, third) == (True, False, True)
    assert kept_a == a.to_json() and stored_embedder(pg_index) == b.to_json()
