"""Embedders: the real local model, the OpenAI one against a loopback server, retries, redaction,
selection."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from memory.config import MemoryConfig
from memory.embedders.embeddings import EmbeddingPipeline, OpenAIEmbedder, redact, select_embedder
from memory.errors import EmbedderError
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.memory.conftest import FakeEmbedder, MemoryBackend, quiet_config


def cosine(a: list[float], b: list[float]) -> float:
    return (sum(x * y for x, y in zip(a, b))
            / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)))


async def test_local_embedder_real_model() -> None:
    """The default ONNX model (bge-small) gives 384-dim unit vectors; a question lands nearer its
    answer than unrelated text, with the query prefix; an over-long text is truncated,
    not refused."""
    from memory.embedders.local_embedder import LocalEmbedder, unavailable_reason

    missing = unavailable_reason()
    if missing is not None:
        pytest.skip(missing)
    embedder = LocalEmbedder()
    assert embedder.spec.name == "bge-small-en-v1.5" and embedder.max_tokens == 512
    a, b, c = await embedder.embed([
        "My favourite programming language is Rust.",
        "I love writing code in Rust more than any other language.",
        "The train to Lisbon leaves at nine in the morning.",
    ])
    assert len(a) == 384 == embedder.dims
    assert math.sqrt(sum(x * x for x in a)) == pytest.approx(1.0, abs=1e-4)
    assert cosine(a, b) > cosine(a, c) + 0.2
    (q,) = await embedder.embed(["Which language do I like to code in?"], "query")
    assert cosine(q, a) > cosine(q, c) + 0.2
    # the prefix counts
    assert (await embedder.embed(["Which language do I like to code in?"], "passage"))[0] != q
    long = await embedder.embed(["word " * 2000])  # truncated at 512 tokens, no error
    assert len(long[0]) == 384


async def test_local_model_with_the_wrong_sha256_is_refused(tmp_path: Path) -> None:
    """A model file whose sha256 is not the pinned one is never loaded."""
    from memory.embedders.local_embedder import LocalEmbedder, unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(str(unavailable_reason()))
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the model")
    with pytest.raises(EmbedderError, match="refusing to load"):
        await LocalEmbedder(model_path=fake).embed(["x"])


async def test_openai_embedder_against_loopback_server() -> None:
    """The OpenAI embedder batches, sends dimensions and float encoding, and keeps input order."""
    server = FakeOpenAI(embedding_dims=48)
    await server.start()
    try:
        embedder = OpenAIEmbedder(api_key="k", base_url=server.base_url, model="fake-embed",
                                  batch_size=2)
        pipeline = EmbeddingPipeline(embedder, max_retries=0)
        texts = [f"text number {i}" for i in range(5)]
        vectors = [v for batch in pipeline.batches(texts)
                   for v in await pipeline.embed_batch(batch)]
        assert server.embedding_calls == 3 and embedder.dims == 48
        assert server.embedded_inputs == texts
        assert all(len(v) == 48 for v in vectors)
        body = server.requests[-1].json
        assert body["encoding_format"] == "float" and "dimensions" not in body
        sized = OpenAIEmbedder(api_key="k", base_url=server.base_url, model="fake-embed",
                               dimensions=16)
        assert len((await sized.embed(["x"]))[0]) == 16
        assert server.requests[-1].json["dimensions"] == 16 and sized.model_id == "fake-embed@16"
        await embedder.aclose()
        await sized.aclose()
    finally:
        await server.close()


async def test_openai_embedder_retries_429_then_succeeds() -> None:
    """A 429 is retried with backoff and the second answer is used; a 400 is not retried."""
    server = FakeOpenAI()
    await server.start()
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)

    try:
        embedder = OpenAIEmbedder(api_key="k", base_url=server.base_url, model="fake-embed")
        pipeline = EmbeddingPipeline(embedder, max_retries=3, sleep=fake_sleep)
        server.script_embeddings(Behaviour(status=429, retry_after=0), Behaviour())
        (vector,) = await pipeline.embed_batch(["hello"])
        assert len(vector) == 64 and server.embedding_calls == 2 and len(sleeps) == 1
        server.script_embeddings(Behaviour(status=400))
        with pytest.raises(EmbedderError) as info:
            await pipeline.embed_batch(["hello"])
        assert info.value.status == 400 and not info.value.retryable
        assert server.embedding_calls == 3
        await embedder.aclose()
    finally:
        await server.close()


async def test_openai_unreachable_is_retryable_error() -> None:
    """A refused connection becomes a retryable EmbedderError."""
    embedder = OpenAIEmbedder(api_key="k", base_url="http://127.0.0.1:9/v1", timeout_s=2)
    with pytest.raises(EmbedderError) as info:
        await embedder.embed(["x"])
    assert info.value.retryable
    await embedder.aclose()


def test_redaction_replaces_personal_data() -> None:
    """E-mails, phone numbers and record numbers become placeholders; ordinary numbers stay."""
    text = ("Mail jane.doe@example.org or call +44 20 7946 0958, MRN: 12345678, SSN 123-45-6789, "
            "in 2026 for 3 days")
    out = redact(text)
    assert "[EMAIL]" in out and "[PHONE]" in out and out.count("[RECORD]") >= 1
    assert "jane" not in out and "7946" not in out and "12345678" not in out and "6789" not in out
    assert "2026" in out and "3 days" in out


async def test_redaction_applies_to_remote_embedder_only(memory_backend: MemoryBackend) -> None:
    """With redaction on, a remote embedder sees placeholders while the stored chunk keeps the
    original."""
    remote = FakeEmbedder()
    remote.remote = True
    memory_backend.write("alice", "s1", ["write to bob@example.com about the invoice"])
    async with memory_backend.opened(quiet_config(redact_before_embedding=True), remote) as svc:
        hits = (await svc.search("alice", "invoice bob@example.com")).results
    assert "bob@example.com" not in " ".join(remote.texts) and "[EMAIL]" in remote.texts[0]
    assert "bob@example.com" in hits[0].content
    local = FakeEmbedder()
    other = memory_backend.another()
    other.write("alice", "s1", ["write to bob@example.com about the invoice"])
    async with other.opened(quiet_config(redact_before_embedding=True), local):
        pass
    assert "bob@example.com" in local.texts[0]


def test_select_embedder_auto_and_explicit() -> None:
    """auto picks openai with a key, else local when importable; none and disabled give no
    embedder."""
    embedder, why = select_embedder(MemoryConfig(embeddings_api_key="sk-x",
                                                 embeddings_base_url="http://127.0.0.1:1/v1"))
    assert embedder is not None and embedder.provider == "openai" and "key" in why
    embedder, why = select_embedder(MemoryConfig())
    assert (embedder is not None and embedder.provider == "local"
            or (embedder is None and "not installed" in why))
    assert select_embedder(MemoryConfig(embedder="none"))[0] is None
    assert select_embedder(MemoryConfig(enabled=False))[0] is None


def test_config_rejects_bad_values() -> None:
    """Out-of-range settings fail at construction with the key named."""
    with pytest.raises(ValueError, match="overlap_tokens"):
        MemoryConfig(chunk_tokens=100, overlap_tokens=100)
    with pytest.raises(ValueError, match="default_k"):
        MemoryConfig(default_k=0)
