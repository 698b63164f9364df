"""An embedder change: the previous model's cached vectors serve the vector leg until the
rebuild ends."""

from __future__ import annotations

from pathlib import Path

import apsw

from gateway.wire import search_wire
from memory import SearchHit
from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, select_embedder
from memory.embedders.previous import EmbedderIdentity
from tests.fake_openai import FakeOpenAI
from tests.memory.conftest import (
    FakeEmbedder,
    MemoryBackend,
    embedder_down,
    fake_vector,
    opened,
    quiet_config,
    session_key,
)

LYNX = "the lynx stalks quietly through snow"
BREAD = "bread rises slowly with flour and yeast"


class SynonymEmbedder(FakeEmbedder):
    """A fake model that reads some words as others: two of them rank the same query differently."""

    def __init__(self, model_id: str, synonyms: dict[str, str], dims: int = 64) -> None:
        super().__init__(dims=dims, model_id=model_id)
        self.synonyms = synonyms

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail is not None:
            raise self.fail
        return [fake_vector(" ".join(self.synonyms.get(w, w) for w in t.lower().split()), self.dims)
                for t in texts]


def model_a() -> SynonymEmbedder:
    return SynonymEmbedder("model-a", {"wildcat": "lynx stalks"})   # "wildcat" means the lynx


def model_b() -> SynonymEmbedder:
    return SynonymEmbedder("model-b", {"wildcat": "bread flour"}, dims=32)   # "wildcat" means bread


def factory_of(embedder: Embedder, asked: list[EmbedderIdentity] | None = None):  # type: ignore[no-untyped-def]
    """A previous-embedder factory that gives ``embedder`` for its own identity only."""
    def build(identity: EmbedderIdentity) -> tuple[Embedder | None, str]:
        if asked is not None:
            asked.append(identity)
        if identity == EmbedderIdentity.of(embedder):
            return embedder, "test"
        return None, f"no test embedder for {identity.model}"
    return build


async def indexed_with_a(tmp_path: Path) -> None:
    await indexed_with_a_on(MemoryBackend("sqlite", tmp_path))


async def indexed_with_a_on(memory_backend: MemoryBackend) -> None:
    """Two sessions, LYNX and BREAD (ten hours later), indexed with model-a."""
    memory_backend.write("alice", "s1", [LYNX])
    memory_backend.write("alice", "s2", [BREAD], start_minute=600)
    async with memory_backend.opened(quiet_config(), model_a()) as svc:
        assert (await svc.status())["pending"] == 0


def content_of(hit: SearchHit) -> str:
    """LYNX or BREAD for the chunk holding that message, else the chunk's text."""
    text = str(hit.content)
    return next((m for m in (LYNX, BREAD) if m in text), text)


def meta(tmp_path: Path, key: str) -> str | None:
    db = apsw.Connection(str(tmp_path / "memory.db"))
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


async def test_previous_model_serves_the_vector_leg_until_the_rebuild_ends(tmp_path: Path) -> None:
    """Mid-rebuild, a query only the vector leg can answer is ranked by the old model's vectors,
    and memory.status names the old model as serving and shows the rebuild's progress."""
    await indexed_with_a(tmp_path)
    new = model_b()
    new.fail = embedder_down()  # the rebuild cannot progress
    async with opened(tmp_path, quiet_config(), new,
                      previous_embedder=factory_of(model_a())) as svc:
        during = await svc.search("alice", "wildcat")
        status = await svc.status()
    assert during.mode == "hybrid" and during.previous_model == "model-a"
    assert ("previous model" in (during.fallback_reason or "")
            and "model-a" in (during.fallback_reason or ""))
    assert [content_of(h) for h in during.results][:2] == [LYNX, BREAD]   # model-a's order
    assert during.results[0].vector_rank == 1 and during.results[0].keyword_rank is None
    assert search_wire(during)["previousModel"] == "model-a"
    vs = status["vectorSearch"]
    assert vs["ready"] is False and vs["servedBy"] == {"provider": "fake", "model": "model-a"}
    assert vs["rebuild"] == {"embedded": 0, "total": 2,
                             "previous": {"provider": "fake", "model": "model-a"},
                             "previousUnavailable": None}
    assert meta(tmp_path, "embedder_previous") == EmbedderIdentity.of(model_a()).to_json()


async def test_new_vectors_take_over_once_the_rebuild_is_done(tmp_path: Path) -> None:
    """When every chunk has the new model's vector, searches rank by the new model and the
    previous model's state (meta key, in-memory vectors, status) is gone."""
    from memory.sqlite import interim

    await indexed_with_a(tmp_path)
    new = model_b()
    new.fail = embedder_down()
    async with opened(tmp_path, quiet_config(), new,
                      previous_embedder=factory_of(model_a())) as svc:
        assert (await svc.search("alice", "wildcat")).previous_model == "model-a"
        assert interim.held(svc.db_path) is not None
        new.fail = None
        await svc.sync_now()
        after = await svc.search("alice", "wildcat")
        status = await svc.status()
        held = interim.held(svc.db_path)
    assert after.mode == "hybrid" and after.fallback_reason is None and after.previous_model is None
    # model-b's order
    assert content_of(after.results[0]) == BREAD and after.results[0].vector_rank == 1
    assert status["vectorSearch"] == {"ready": True, "reason": None, "rebuild": None,
                                      "servedBy": {"provider": "fake", "model": "model-b"}}
    assert held is None and meta(tmp_path, "embedder_previous") is None
    assert "previousModel" not in search_wire(after)


async def test_keyword_fallback_when_the_previous_model_cannot_be_built(
        memory_backend: MemoryBackend) -> None:
    """Without a way to embed queries with the old model, hybrid search is keyword-only with a
    reason saying why, and memory.status says nothing serves vectors and why."""
    await indexed_with_a_on(memory_backend)
    new = model_b()
    new.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), new) as svc:   # the default factory:
                                                                    # "fake" is unknown
        during = await svc.search("alice", "lynx")
        status = await svc.status()
    assert during.mode == "keyword" and during.previous_model is None
    assert ("rebuilt" in (during.fallback_reason or "")
            and "'fake' cannot be rebuilt" in (during.fallback_reason or ""))
    assert [content_of(h) for h in during.results] == [LYNX]
    vs = status["vectorSearch"]
    assert vs["servedBy"] is None
    assert vs["rebuild"]["previous"] == {"provider": "fake", "model": "model-a"}
    assert "'fake' cannot be rebuilt" in vs["rebuild"]["previousUnavailable"]


async def test_a_failing_previous_model_falls_back_to_keyword(
        memory_backend: MemoryBackend) -> None:
    """A previous model that fails to embed the query leaves that search keyword-only, saying so."""
    await indexed_with_a_on(memory_backend)
    new, old = model_b(), model_a()
    new.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), new, previous_embedder=factory_of(old)) as svc:
        old.fail = embedder_down()
        during = await svc.search("alice", "lynx")
    assert during.mode == "keyword" and during.previous_model is None
    assert "failed to embed the query" in (during.fallback_reason or "")
    assert [content_of(h) for h in during.results] == [LYNX]


async def test_chunk_added_mid_rebuild_is_found_by_keyword_only(
        memory_backend: MemoryBackend) -> None:
    """A chunk written during the rebuild has no old-model vector: keyword finds it, and it never
    carries an old-model similarity, while the old chunks keep theirs."""
    await indexed_with_a_on(memory_backend)
    new = model_b()
    new.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), new,
                                     previous_embedder=factory_of(model_a())) as svc:
        memory_backend.write("alice", "s3", ["a lynx kitten naps in the barn"], start_minute=900)
        await svc.sync_now()
        hits = (await svc.search("alice", "lynx")).results
    by_text = {content_of(h): h for h in hits}
    added = next(h for text, h in by_text.items() if "kitten" in text)
    assert added.keyword_rank is not None and added.vector_rank is None and added.similarity is None
    assert by_text[LYNX].vector_rank is not None and by_text[LYNX].similarity is not None


async def test_a_full_reindex_mid_rebuild_keeps_the_previous_model_serving(
        memory_backend: MemoryBackend) -> None:
    """A full reindex during the rebuild re-cuts every chunk: the previous model's vectors of the
    texts it embedded still rank its queries (on PostgreSQL they come back from the cache)."""
    await indexed_with_a_on(memory_backend)
    new = model_b()
    new.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), new,
                                     previous_embedder=factory_of(model_a())) as svc:
        await svc.sync_now(full=True)
        during = await svc.search("alice", "wildcat")
    assert during.previous_model == "model-a"
    assert content_of(during.results[0]) == LYNX and during.results[0].vector_rank == 1
    assert {content_of(h) for h in during.results} == {LYNX, BREAD}


async def test_full_reindexes_mid_rebuild_do_not_pile_up_in_the_previous_sign_bits(
        tmp_path: Path) -> None:
    """SQLite: each full reindex re-cuts every chunk under a new id; the in-memory sign bits
    are loaded again rather than growing by the deleted chunks' slots, and still rank."""
    from memory.sqlite import interim

    await indexed_with_a(tmp_path)
    new = model_b()
    new.fail = embedder_down()
    async with opened(tmp_path, quiet_config(), new,
                      previous_embedder=factory_of(model_a())) as svc:
        held = []
        for _ in range(3):
            await svc.sync_now(full=True)
            during = await svc.search("alice", "wildcat")
            vectors = interim.held(svc.db_path)
            held.append(vectors.chunks if vectors is not None else None)
    assert held == [2, 2, 2]
    assert during.previous_model == "model-a" and content_of(during.results[0]) == LYNX


async def test_previous_vector_leg_honours_session_and_time_filters(
        memory_backend: MemoryBackend) -> None:
    """The old model's vector leg applies sessionKey, excludeSessionKey and after/before as the
    normal leg does."""
    await indexed_with_a_on(memory_backend)
    new = model_b()
    new.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), new,
                                     previous_embedder=factory_of(model_a())) as svc:
        only = await svc.search("alice", "wildcat", session_key=session_key("s2"))
        without = await svc.search("alice", "wildcat", exclude_session_key=session_key("s1"))
        late = await svc.search("alice", "wildcat", after="2026-11-22T15:00:00Z")
        everything = await svc.search("alice", "wildcat")
    assert only.previous_model == "model-a" and [content_of(h) for h in only.results] == [BREAD]
    assert [content_of(h) for h in without.results] == [BREAD]
    assert [content_of(h) for h in late.results] == [BREAD]   # s2 starts at minute 600
    assert {content_of(h) for h in everything.results} == {LYNX, BREAD}


async def test_second_change_mid_rebuild_keeps_serving_the_last_complete_model(
        memory_backend: MemoryBackend) -> None:
    """Changing the embedder again before a rebuild finishes keeps the last fully built model as
    the one that serves, never the half-built one."""
    await indexed_with_a_on(memory_backend)
    first = model_b()
    first.fail = embedder_down()
    async with memory_backend.opened(quiet_config(), first,
                                     previous_embedder=factory_of(model_a())):
        pass
    third = SynonymEmbedder("model-c", {}, dims=16)
    third.fail = embedder_down()
    asked: list[EmbedderIdentity] = []
    async with memory_backend.opened(quiet_config(), third,
                                     previous_embedder=factory_of(model_a(), asked)) as svc:
        during = await svc.search("alice", "wildcat")
    assert {i.model for i in asked} == {"model-a"}
    assert during.previous_model == "model-a" and content_of(during.results[0]) == LYNX


async def test_openai_model_change_embeds_queries_with_the_previous_model(
        memory_backend: MemoryBackend, fake_openai: FakeOpenAI) -> None:
    """With the configured OpenAI-compatible endpoint, only the model changed: the default
    factory rebuilds the previous model, whose name and dimensions the query requests carry."""
    memory_backend.write("alice", "s1", [LYNX])

    def config(model: str, dims: int) -> MemoryConfig:
        return quiet_config(embedder="openai", embeddings_base_url=fake_openai.base_url,
                            embeddings_api_key="sk-test", embeddings_model=model,
                            embeddings_dimensions=dims)

    old_config = config("embed-a", 64)
    embedder, _ = select_embedder(old_config)
    async with memory_backend.opened(old_config, embedder):
        pass
    await embedder.aclose()  # type: ignore[union-attr]
    fake_openai.configure_embeddings(status=503)   # the new model's rebuild cannot progress
    new_config = config("embed-b", 32)
    embedder, _ = select_embedder(new_config)
    try:
        async with memory_backend.opened(new_config, embedder) as svc:  # its start-up sync is over
            fake_openai.configure_embeddings(status=None)
            fake_openai.requests.clear()
            during = await svc.search("alice", "lynx")
            status = await svc.status()
    finally:
        await embedder.aclose()  # type: ignore[union-attr]
    asked = [r.json for r in fake_openai.requests if r.path == "/v1/embeddings"]
    assert during.previous_model == "embed-a@64" and during.results[0].vector_rank == 1
    assert [(a["model"], a["dimensions"]) for a in asked] == [("embed-a", 64)]
    assert status["vectorSearch"]["servedBy"] == {"provider": "openai", "model": "embed-a@64"}


def test_previous_embedder_is_rebuilt_only_from_what_the_configuration_still_has() -> None:
    """The default factory rebuilds an installed local model (window included) or a model of the
    configured endpoint, and refuses, with a reason, what it cannot rebuild exactly."""
    from memory.embedders.embeddings import OpenAIEmbedder, endpoint_hash, previous_embedder
    from memory.embedders.local_embedder import LocalEmbedder, unavailable_reason

    config = quiet_config(embeddings_base_url="http://127.0.0.1:9/v1", embeddings_api_key="sk-test")
    if unavailable_reason("bge-small-en-v1.5") is None:
        local, _ = previous_embedder(config, "local", "bge-small-en-v1.5-int8@256", "local")
        assert isinstance(local, LocalEmbedder) and local.model_id == "bge-small-en-v1.5-int8@256"
    missing, why = previous_embedder(config, "local", "no-such-model-int8", "local")
    assert missing is None and "not one this version knows" in why
    remote, _ = previous_embedder(config, "openai", "embed-a@64",
                                  endpoint_hash("http://127.0.0.1:9/v1"))
    assert isinstance(remote, OpenAIEmbedder) and remote.model_id == "embed-a@64"
    elsewhere, why = previous_embedder(config, "openai", "embed-a",
                                       endpoint_hash("http://elsewhere/v1"))
    assert elsewhere is None and "not the configured one" in why
    fake, why = previous_embedder(config, "fake", "fake-bow", "none")
    assert fake is None and "'fake' cannot be rebuilt" in why
