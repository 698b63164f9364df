"""Synthetic vectors drawn from the real local embedder's distribution (for ``bench/scale.py``).

Running the local model over a million chunks takes days on a 2-core machine, and Gaussian
clusters around random centroids (``bench.corpus.SyntheticEmbedder``) are isotropic, which real
sentence embeddings are not: bge-small's vectors share a large common direction and their
variance sits in few dimensions, the worst case for a sign-bit pre-filter. So the scale bench
*fits* the real embedder once and draws from the fit:

1. Real chat text (RealMem's turns, ``bench/data/realmem_bench.json``, else
   ``bench/data/sample.json``) is embedded by the real :class:`LocalEmbedder` — passages as
   chunk-like windows of consecutive turns of one session, questions with the query prefix.
2. The fit is the passages' mean μ, the covariance of per-session means (between, Σb) and of
   each passage about its session's mean (within, Σw), and the questions' mean μq.
3. A synthetic text's vector is ``μ + Σb^½·z_topic + Σw^½·ε`` (a query: ``μq + …``), unit
   normalised, where ``z_topic`` mixes the text's topic latent with latents of the topic words
   it contains, and ``ε`` is seeded by the text's hash — deterministic, clustered like
   sessions, anisotropic like the model.

The fit is cached in ``bench/.cache/`` (a few hundred texts, ~1 minute with the local model).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.corpus import CACHE_DIR, DIMS, TOPICS, Vocabulary

__all__ = ["Fit", "RealDistEmbedder", "load_fit"]

REPO = Path(__file__).resolve().parent.parent
SOURCES = (REPO / "bench" / "data" / "realmem_bench.json", REPO / "bench" / "data" / "sample.json")
WINDOW_TURNS = 4       # consecutive turns per passage: roughly one 400-token chunk of chat
MAX_PASSAGE_CHARS = 1600


@dataclass(frozen=True)
class Fit:
    mean: np.ndarray          # (dims,) passages
    query_mean: np.ndarray    # (dims,) questions, query prefix
    between: np.ndarray       # (dims, dims) Σb^½
    within: np.ndarray        # (dims, dims) Σw^½
    info: dict[str, Any]      # source, model, counts, checks


def _sqrtm(cov: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh((cov + cov.T) / 2)
    root: np.ndarray = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    return root


def _texts(source: Path, sessions: int, questions: int,
           seed: int) -> tuple[list[str], list[int], list[str]]:
    data = json.loads(source.read_text())
    # Sessions long enough for two windows, so each has a within-session spread to measure.
    all_sessions = [s for c in data["conversations"] for s in c["sessions"]
                    if len(s["turns"]) >= 2 * WINDOW_TURNS]
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(all_sessions), size=min(sessions, len(all_sessions)), replace=False)
    passages: list[str] = []
    owner: list[int] = []
    for n, i in enumerate(picked):
        turns = [t["text"] for t in all_sessions[int(i)]["turns"]]
        for start in range(0, min(len(turns) - WINDOW_TURNS + 1, 3 * WINDOW_TURNS), WINDOW_TURNS):
            passages.append("\n".join(turns[start:start + WINDOW_TURNS])[:MAX_PASSAGE_CHARS])
            owner.append(n)
    qs = [q["question"] for q in data["questions"]]
    qpick = rng.choice(len(qs), size=min(questions, len(qs)), replace=False)
    return passages, owner, [qs[int(i)] for i in qpick]


async def _embed(texts: list[str], kind: str) -> np.ndarray:
    from memory.embedders.local_embedder import LocalEmbedder

    embedder = LocalEmbedder()
    out: list[list[float]] = []
    for i in range(0, len(texts), 16):
        out.extend(await embedder.embed(texts[i:i + 16], kind=kind))  # type: ignore[arg-type]
    return np.asarray(out, dtype=np.float64)


def _run(coro: Any) -> np.ndarray:
    """``asyncio.run`` that also works when called from a running loop (``bench.corpus.
    index_corpus`` makes the embedder inside one): then the coroutine runs on its own thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[no-any-return]


def _model_id() -> str:
    from memory.embedders.local_embedder import LocalEmbedder

    return LocalEmbedder().model_id


def load_fit(*, sessions: int = 110, questions: int = 120, seed: int = 5) -> Fit:
    """The cached fit, made on first use by running the local embedder."""
    source = next(p for p in SOURCES if p.exists())
    model = _model_id()
    key = hashlib.blake2b(f"{source.name}|{model}|{sessions}|{questions}|{seed}".encode(),
                          digest_size=6).hexdigest()
    path = CACHE_DIR / f"realdist-{key}.npz"
    if path.exists():
        saved = np.load(path, allow_pickle=False)
        return Fit(saved["mean"], saved["query_mean"], saved["between"], saved["within"],
                   json.loads(str(saved["info"])))
    passages, owner, qs = _texts(source, sessions, questions, seed)
    started = time.perf_counter()
    p = _run(_embed(passages, "passage"))
    q = _run(_embed(qs, "query"))
    took = time.perf_counter() - started
    owners = np.asarray(owner)
    groups = np.unique(owners)
    session_means = np.stack([p[owners == g].mean(axis=0) for g in groups])
    mean = p.mean(axis=0)
    between = np.cov(session_means, rowvar=False)
    residual = p - session_means[np.searchsorted(groups, owners)]
    # Residuals about a mean of n_s passages shrink by (n_s - 1) / n_s: scaled back up.
    sizes = np.bincount(np.searchsorted(groups, owners))
    residual *= np.sqrt(sizes / np.maximum(sizes - 1, 1))[np.searchsorted(groups, owners), None]
    within = residual.T @ residual / max(1, len(p) - len(groups))
    iu = np.triu_indices(len(p), 1)
    info = {
        "source": source.name, "model": model, "passages": len(p), "sessions": len(groups),
        "questions": len(q), "embed_s": round(took, 1),
        "real_mean_pairwise_cosine": float((p @ p.T)[iu].mean()),
        "real_query_mean_cosine": float((q @ p.T).mean()),
        "between_share_of_variance": float(np.trace(between)
                                           / (np.trace(between) + np.trace(within))),
    }
    fit = Fit(mean, q.mean(axis=0), _sqrtm(between), _sqrtm(within), info)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.savez(path, passages=p, queries=q, mean=fit.mean, query_mean=fit.query_mean,
             between=fit.between, within=fit.within, info=json.dumps(info))
    return fit


class RealDistEmbedder:
    """Deterministic vectors from :class:`Fit` for the synthetic corpus's texts (module doc)."""

    provider = "synthetic"
    model_id = "realdist-v1"
    dims = DIMS
    max_tokens = None
    batch_size = 256
    endpoint_hash = "bench"
    remote = False

    def __init__(self, fit: Fit, vocab: Vocabulary, seed: int = 13) -> None:
        rng = np.random.default_rng(seed)
        self.fit = fit
        self.model_id = f"realdist-v1-{fit.info['model']}"
        self.topic_latent = rng.normal(size=(TOPICS, DIMS))
        words = [w for ws in vocab.topic_words for w in ws]
        self.word_index = {w: i for i, w in enumerate(words)}
        self.word_topic = np.array([t for t, ws in enumerate(vocab.topic_words) for _ in ws])
        self.word_latent = rng.normal(size=(len(words), DIMS))
        self.between_t = fit.between.T.astype(np.float32)
        self.within_t = fit.within.T.astype(np.float32)
        self.calls = 0

    def _latent(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        found = [self.word_index[w] for w in (t.strip(".,?!:") for t in text.split())
                 if w in self.word_index]
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        noise = np.random.default_rng(seed).normal(size=DIMS)
        if not found:
            return np.zeros(DIMS), noise
        idx = np.asarray(found)
        topic = np.bincount(self.word_topic[idx], minlength=TOPICS) / len(idx) @ self.topic_latent
        # Words: the mean of k unit-variance latents has variance 1/k; scaled back to 1.
        words = self.word_latent[idx].mean(axis=0) * np.sqrt(len(idx))
        return (0.8 * topic + 0.6 * words), noise

    def vectors(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        pairs = [self._latent(t) for t in texts]
        z = np.stack([p[0] for p in pairs]).astype(np.float32)
        e = np.stack([p[1] for p in pairs]).astype(np.float32)
        base = self.fit.query_mean if kind == "query" else self.fit.mean
        v = base.astype(np.float32) + z @ self.between_t + e @ self.within_t
        units: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
        return units

    def vector(self, text: str, kind: str = "passage") -> np.ndarray:
        one: np.ndarray = self.vectors([text], kind)[0]
        return one

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.calls += 1
        return self.vectors(texts, kind).tolist()  # type: ignore[no-any-return]
