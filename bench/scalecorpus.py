"""The scale bench's corpora: ``bench.corpus``'s chat-shaped text, vectors from
:class:`bench.realdist.RealDistEmbedder`, built once by the real indexer and cached.

``python -m bench.scalecorpus 1000000`` builds one size ahead of ``make bench-scale`` (the 1M
corpus takes the better part of an hour on a shared 2-core machine). Each built directory holds
a ``READY`` file with the build's own figures (seconds per phase, chunk counts), so a run that
finds the corpus cached still reports how fast it was built, and when.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from bench.corpus import CACHE_DIR, TOPICS, USER, Vocabulary, bench_memory_config, index_corpus
from bench.realdist import RealDistEmbedder, load_fit

__all__ = ["ScaleCorpus", "build", "corpus_dir", "keyword_build"]

VERSION = "s1"  # s1 corpora were written by the per-message writer; same distributions
MESSAGES_PER_CHUNK = 4.1   # bench.corpus: ~4 new messages per 400-token chunk at these lengths


@dataclass(frozen=True)
class ScaleCorpus:
    data_dir: Path
    chunks: int
    build: dict[str, Any]   # READY's figures
    fresh: bool             # built by this run


def corpus_dir(size: int) -> Path:
    return CACHE_DIR / f"scale-{size}-{VERSION}"


def write_sessions(data_dir: Path, *, messages: int, per_session: int = 50, seed: int = 3,
                   words: tuple[int, int] = (12, 70)) -> int:
    """``bench.corpus.write_transcripts``'s text, each transcript written whole.

    The store's ``append_message`` (one write, one index update per message) takes hours for
    4M messages here, so lines are made by the sessions package's own serialisers
    (``Header.to_line``, ``Message.to_line``) and each file is written at once; the store
    then reconciles ``sessions.db`` from the files, as it does for any copied-in transcript.
    Words (and which of them are topic words) come from one vectorised draw per session.
    """
    import orjson

    from sessions import SessionsConfig, SessionStore, sessions_root
    from sessions.layout import transcript_file
    from sessions.models import Message, format_ts
    from sessions.transcript import Header

    vocab = Vocabulary.make()
    common = np.array(vocab.common)
    cdf = np.cumsum(vocab.weights)
    rng = np.random.default_rng(seed)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    config = SessionsConfig(fsync="never")
    root = sessions_root(data_dir)
    (root / USER).mkdir(parents=True, exist_ok=True)
    n_sessions = max(1, -(-messages // per_session))
    written = 0
    for s in range(n_sessions):
        topic = int(rng.integers(TOPICS))
        start = base + timedelta(hours=s * 3)
        key = f"{seed:02x}{s:030x}"
        count = min(per_session, messages - written)
        lengths = rng.integers(*words, size=count)
        total = int(lengths.sum())
        drawn = common[np.minimum(np.searchsorted(cdf, rng.random(total)), len(common) - 1)]
        # About a sixth of the words are the topic's own, as in bench.corpus.
        topical = rng.random(total) < 1 / 6
        drawn[topical] = np.array(vocab.topic_words[topic])[
            rng.integers(25, size=int(topical.sum()))]
        ends = np.cumsum(lengths)
        lines = [orjson.dumps(Header(key, USER, format_ts(start), f"t{topic}").to_line()) + b"\n"]
        for m in range(count):
            content = " ".join(drawn[ends[m] - lengths[m]:ends[m]].tolist())
            message = Message(uuid.uuid4().hex, "user" if m % 2 == 0 else "assistant", content,
                              format_ts(start + timedelta(seconds=30 * m)), f"r{m // 2}")
            lines.append(orjson.dumps(message.to_line()) + b"\n")
        transcript_file(root, USER, key).write_bytes(b"".join(lines))
        written += count
    with SessionStore(data_dir, config):
        pass  # reconciles sessions.db from the files once, here, not in the first measured start
    return n_sessions


def embedder() -> RealDistEmbedder:
    return RealDistEmbedder(load_fit(), Vocabulary.make())


async def _index(data_dir: Path, log: Any) -> dict[str, Any]:
    def keyword_done(chunks: int, seconds: float) -> None:
        log(f"  {chunks:,} chunks indexed keyword-only in {seconds:.0f} s; vectors…")

    # The fit comes after the text: it may still be computing (by another process) until then.
    done = await index_corpus(data_dir, embedder, keyword_done)
    return {"chunks": done.chunks, "keyword_s": done.keyword_s, "embed_s": done.embed_s,
            "embedded": done.embedded, "vectors": done.embedder.model_id,
            "fit": done.embedder.fit.info}


def keyword_build(data_dir: Path) -> tuple[int, float]:
    """The keyword-only pass of the build timed again, by this checkout's indexer, over a built
    corpus's transcripts into a scratch index (the cached one, and READY's figures, stay as
    they are): chunks written and seconds."""
    import tempfile

    from memory.sqlite.index.db import WriteConnection, open_index
    from memory.sqlite.index.indexing import Indexer
    from sessions import sessions_root

    with tempfile.TemporaryDirectory(dir=data_dir.parent) as scratch:
        opened = open_index(Path(scratch) / "memory.db")
        conn = WriteConnection(opened.db)
        try:
            indexer = Indexer.on(conn, opened.vectors, sessions_root(data_dir),
                                 bench_memory_config())
            started = time.perf_counter()
            report = asyncio.run(indexer.sync(None))
            return report.chunks_written, time.perf_counter() - started
        finally:
            conn.close()


def build(size: int, *, fresh: bool = False, log: Any = print) -> ScaleCorpus:
    """A data dir with ~``size`` indexed chunks (cached in ``bench/.cache``)."""
    data_dir = corpus_dir(size)
    marker = data_dir / "READY"
    if marker.exists() and not fresh:
        return ScaleCorpus(data_dir, int(json.loads(marker.read_text())["chunks"]),
                           json.loads(marker.read_text()), False)
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    messages = int(size * MESSAGES_PER_CHUNK)
    log(f"building {size:,}-chunk corpus in {data_dir} ({messages:,} messages)…")
    started = time.perf_counter()
    write_sessions(data_dir, messages=messages)
    write_s = time.perf_counter() - started
    log(f"  transcripts written in {write_s:.0f} s; indexing…")
    figures = asyncio.run(_index(data_dir, log))
    figures.update({"write_s": write_s, "messages": messages,
                    "built_at": datetime.now(UTC).isoformat()})
    log(f"  {figures['chunks']:,} chunks: keyword index {figures['keyword_s']:.0f} s, "
        f"vectors {figures['embed_s']:.0f} s")
    marker.write_text(json.dumps(figures, indent=1))
    return ScaleCorpus(data_dir, int(figures["chunks"]), figures, True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        c = build(int(arg))
        print(json.dumps({"dir": str(c.data_dir), "fresh": c.fresh, **c.build}, indent=1))
