"""Synthetic, reproducible corpora for the speed benchmarks.

Text: every session has a topic; its messages draw words from a Zipf distribution over a
fixed vocabulary of English function words and generated content words, mixed with that
topic's own words, so keyword queries behave like real ones (common words match almost
everything, topic words match a cluster). Vectors: 384-dim unit vectors, the topic's centroid
plus Gaussian noise seeded by the text's hash, so they have cluster structure.

Transcripts are written by the real ``SessionStore`` (keys from a counter, so files and chunk
ids come in the same order every run), then indexed by the real
``memory.sqlite.index.indexing.Indexer``; vectors come from :class:`SyntheticEmbedder` through the
real embedding pipeline and cache, so the local model is never run on 100k texts. Built databases
are kept in ``bench/.cache`` keyed by the corpus parameters.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from memory import MemoryConfig
from sessions import SessionsConfig, SessionStore

__all__ = ["CACHE_DIR", "CHUNK_TOKENS", "DIMS", "OVERLAP_TOKENS", "TOPICS", "USER", "Corpus",
           "SyntheticEmbedder", "Vocabulary", "bench_memory_config", "bench_memory_section",
           "build_corpus", "corpus_fingerprint", "index_corpus", "queries", "write_transcripts"]

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
# The synthetic corpora keep round 1's fixed chunking, so speed figures stay comparable across
# rounds (the product sizes chunks for its embedder; these vectors come from no model).
CHUNK_TOKENS, OVERLAP_TOKENS = 400, 80


def bench_memory_config() -> MemoryConfig:
    """The memory settings every speed section indexes its synthetic corpora with."""
    return MemoryConfig(watch=False, chunk_tokens=CHUNK_TOKENS, overlap_tokens=OVERLAP_TOKENS)


DIMS = 384
TOPICS = 200
USER = "bench"


def bench_memory_section() -> dict[str, Any]:
    """The gateway config's ``[memory]`` overrides that keep a cached corpus's chunking: with
    the product's defaults a gateway's catch-up sync re-chunks the whole corpus on start."""
    return {"chunk_tokens": CHUNK_TOKENS, "overlap_tokens": OVERLAP_TOKENS}


def corpus_fingerprint(db_path: Path, user: str = USER) -> str:
    """A digest of the user's chunks (id and content hash, in id order): a cache computed from
    a corpus stores it, and is used again only while the corpus still has the same chunks."""
    import apsw

    digest = hashlib.blake2b(digest_size=16)
    db = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        for chunk_id, content_hash in db.execute(
                "SELECT id, content_hash FROM chunks WHERE user = ? ORDER BY id", (user,)):
            digest.update(f"{chunk_id}:{content_hash}\n".encode())
    finally:
        db.close()
    return digest.hexdigest()


FUNCTION_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by not word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line"
).split()


def _syllable_words(rng: np.random.Generator, n: int) -> list[str]:
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br",
              "ch", "cl", "dr", "gr", "pl", "pr", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck"]
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(2, 4))
        words.add("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                          + codas[rng.integers(len(codas))] for _ in range(k)))
    return sorted(words)


@dataclass(frozen=True)
class Vocabulary:
    common: list[str]          # function words + general content words, Zipf-weighted
    weights: np.ndarray
    topic_words: list[list[str]]

    @classmethod
    def make(cls, seed: int = 7) -> Vocabulary:
        rng = np.random.default_rng(seed)
        general = _syllable_words(rng, 6000)
        rng.shuffle(general)
        topic_pool, general = general[:TOPICS * 25], general[TOPICS * 25:]
        common = list(FUNCTION_WORDS) + general
        ranks = np.arange(1, len(common) + 1, dtype=np.float64)
        weights = 1.0 / ranks ** 1.07
        weights /= weights.sum()
        topic_words = [topic_pool[i * 25:(i + 1) * 25] for i in range(TOPICS)]
        return cls(common, weights, topic_words)


class SyntheticEmbedder:
    """Deterministic clustered vectors: topic centroid (found from the text's topic words) plus
    noise seeded by the text's hash. Counts its calls like the tests' fake embedder."""

    provider = "synthetic"
    model_id = "clusters-v1"
    dims = DIMS
    max_tokens = None
    batch_size = 256
    endpoint_hash = "bench"
    remote = False

    def __init__(self, vocab: Vocabulary, seed: int = 11, noise: float = 0.9) -> None:
        rng = np.random.default_rng(seed)
        self.centroids = rng.normal(size=(TOPICS, DIMS)).astype(np.float32)
        self.topic_of = {w: t for t, words in enumerate(vocab.topic_words) for w in words}
        self.noise = noise
        self.calls = 0
        self.texts = 0

    def vector(self, text: str) -> np.ndarray:
        counts = np.zeros(TOPICS, dtype=np.float32)
        for word in text.split():
            t = self.topic_of.get(word.strip(".,?!:"))
            if t is not None:
                counts[t] += 1
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        noise = np.random.default_rng(seed).normal(size=DIMS).astype(np.float32)
        v = (counts / max(1.0, counts.sum())) @ self.centroids * 1.0 + noise * self.noise
        unit: np.ndarray = v / np.linalg.norm(v)
        return unit

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.calls += 1
        self.texts += len(texts)
        return [self.vector(t).tolist() for t in texts]


def _sentence(rng: np.random.Generator, vocab: Vocabulary, topic: int, n_words: int) -> str:
    common = rng.choice(len(vocab.common), size=n_words, p=vocab.weights)
    words = [vocab.common[i] for i in common]
    tw = vocab.topic_words[topic]
    for pos in rng.choice(n_words, size=max(1, n_words // 6), replace=False):
        words[pos] = tw[int(rng.integers(len(tw)))]
    return " ".join(words)


def write_transcripts(root: Path, *, messages: int, per_session: int, seed: int = 3,
                      user: str = USER, words: tuple[int, int] = (12, 70)) -> int:
    """Write ``messages`` messages into sessions of ``user`` under ``root`` through the real
    ``SessionStore``; returns the number of sessions."""
    vocab = Vocabulary.make()
    rng = np.random.default_rng(seed)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    n_sessions = max(1, -(-messages // per_session))
    keys = (f"{seed:02x}{s:030x}" for s in range(n_sessions))  # 32 hex digits, in creation order
    written = 0
    with SessionStore(root, SessionsConfig(fsync="never"), key_factory=lambda: next(keys)) as store:
        for s in range(n_sessions):
            topic = int(rng.integers(TOPICS))
            start = base + timedelta(hours=s * 3)
            key = store.create(user, title=f"t{topic}", created_at=start).session_key
            count = min(per_session, messages - written)
            for m in range(count):
                n = int(rng.integers(*words))
                store.append_message(user, key, role="user" if m % 2 == 0 else "assistant",
                                     content=_sentence(rng, vocab, topic, n), run_id=f"r{m // 2}",
                                     ts=start + timedelta(seconds=30 * m))
            written += count
    return n_sessions


def queries(n: int, seed: int = 99) -> list[str]:
    """Question-like queries: a few common words and two or three topic words."""
    vocab = Vocabulary.make()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        topic = int(rng.integers(TOPICS))
        lead = ["what", "did", "we", "say", "about", "the", "how", "do", "I", "my"]
        words = [lead[int(i)] for i in rng.choice(len(lead), size=3, replace=False)]
        words += [vocab.topic_words[topic][int(i)]
                  for i in rng.choice(25, size=int(rng.integers(2, 4)), replace=False)]
        out.append(" ".join(words))
    return out


@dataclass
class Corpus:
    data_dir: Path
    chunks: int
    build_s: float            # 0 when it came from the cache
    keyword_chunks_per_s: float | None
    embed_chunks_per_s: float | None


async def build_corpus(target_chunks: int, *, fresh: bool = False) -> Corpus:
    """A data dir holding ~``target_chunks`` indexed chunks with synthetic vectors (cached)."""
    # ~4 new messages per 400-token chunk with these message lengths (measured).
    messages = int(target_chunks * 4.1)
    data_dir = CACHE_DIR / f"corpus-{target_chunks}-v4"
    marker = data_dir / "READY"
    if marker.exists() and not fresh:
        n, _, built = marker.read_text().partition(" ")
        # A corpus that something re-chunked since it was built is not the one being measured.
        if built.strip() == corpus_fingerprint(data_dir / "memory.db"):
            return Corpus(data_dir, int(n), 0.0, None, None)
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    write_transcripts(data_dir, messages=messages, per_session=50)
    done = await index_corpus(data_dir, lambda: SyntheticEmbedder(Vocabulary.make()))
    marker.write_text(f"{done.chunks} {corpus_fingerprint(data_dir / 'memory.db')}\n")
    return Corpus(data_dir, done.chunks, done.keyword_s + done.embed_s,
                  done.chunks / done.keyword_s, done.embedded / done.embed_s)


@dataclass(frozen=True, slots=True)
class Indexed:
    chunks: int
    keyword_s: float
    embedded: int
    embed_s: float
    embedder: Any


async def index_corpus(data_dir: Path, make_embedder: Callable[[], Any],
                       on_keyword: Callable[[int, float], None] | None = None) -> Indexed:
    """Index a data dir's transcripts with the real indexer: keyword-only first (timed), then
    the vectors of ``make_embedder()`` (called only then, so it may still be preparing)."""
    from memory import SyncReport
    from memory.embedders.embeddings import EmbeddingPipeline
    from memory.embedders.previous import EmbedderIdentity
    from memory.sqlite.index.db import WriteConnection, open_index
    from memory.sqlite.index.indexing import Indexer
    from sessions import sessions_root

    config = bench_memory_config()
    opened = open_index(data_dir / "memory.db")
    conn = WriteConnection(opened.db)
    indexer = Indexer.on(conn, opened.vectors, sessions_root(data_dir), config)
    started = time.perf_counter()
    report = await indexer.sync(None)
    keyword_s = time.perf_counter() - started
    if on_keyword is not None:
        on_keyword(report.chunks_written, keyword_s)
    embedder = make_embedder()
    pipeline = EmbeddingPipeline.from_config(embedder, config)
    started = time.perf_counter()
    indexer.vectors.prepare(EmbedderIdentity.of(embedder))
    vec_report = SyncReport()
    await indexer.embed_pending(pipeline, vec_report)
    embed_s = time.perf_counter() - started
    opened.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return Indexed(report.chunks_written, keyword_s, vec_report.embedded, embed_s, embedder)
