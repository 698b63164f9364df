"""Embedders: the OpenAI-compatible one, selection, and the code around the Protocol.

An :class:`Embedder` (``memory.embedders.base``) is ``provider``, ``model_id``, ``dims``,
``batch_size``, ``endpoint_hash``, ``remote`` and one ``async embed(texts) -> list[list[float]]``
(plain float lists, one per text, in order). Implementations only call their model. Around them,
once:

* :class:`EmbeddingPipeline` — batching by count and total characters, retries with
  exponential backoff and full jitter on errors marked ``retryable`` (429, 5xx, timeouts,
  connection errors), and redaction of the text sent to a *remote* embedder when configured.
* the embedding cache (``memory.sqlite.index.vectors``) — keyed by (provider, model, endpoint_hash,
  sha256 of the exact text sent).

``dims`` may be 0 for an OpenAI embedder with no configured ``dimensions``: it is learnt from
the first response.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import structlog

from memory.config import MemoryConfig
from memory.embedders.base import Embedder, EmbedKind
from memory.errors import EmbedderError

__all__ = [
    "EmbedKind",
    "Embedder",
    "EmbeddingPipeline",
    "OpenAIEmbedder",
    "RecentQueries",
    "endpoint_hash",
    "previous_embedder",
    "probe_auto_embedder",
    "redact",
    "select_embedder",
]

log = structlog.get_logger("memory.embedders.embeddings")


def endpoint_hash(base_url: str | None) -> str:
    """A short stable hash of where vectors come from (never the API key)."""
    return hashlib.sha256((base_url or "").rstrip("/").encode()).hexdigest()[:16]


# --- redaction ------------------------------------------------------------------------------

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_RECORD = re.compile(
    r"\b(?:MRN|NHS|SSN|ID|Patient(?:\s+ID)?|Record|Acct|Account)\s*(?:No\.?|number|#)?\s*[:#]?\s*[A-Z0-9][A-Z0-9-]{3,}\b",
    re.IGNORECASE,
)
_SSN = re.compile(r"\b\d{3}-\d{2}-\d{4}\b")
_PHONE = re.compile(r"(?<![\w])\+?\d[\d\s().-]{6,}\d(?![\w])")


def redact(text: str) -> str:
    """Replace e-mail addresses, record numbers (MRN/ID/SSN…) and phone numbers by placeholders."""
    text = _EMAIL.sub("[EMAIL]", text)
    text = _RECORD.sub("[RECORD]", text)
    text = _SSN.sub("[RECORD]", text)

    def phone(m: re.Match[str]) -> str:
        digits = sum(ch.isdigit() for ch in m.group())
        return "[PHONE]" if 7 <= digits <= 15 else m.group()

    return _PHONE.sub(phone, text)


# --- the pipeline around any embedder ------------------------------------------------------


class EmbeddingPipeline:
    """Batching, retries and redaction around one embedder; the only caller of ``embed``."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        max_batch_chars: int = 200_000,
        max_retries: int = 4,
        redact_remote: bool = False,
        base_delay_s: float = 0.5,
        max_delay_s: float = 20.0,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.embedder = embedder
        self.max_batch_chars = max_batch_chars
        self.max_retries = max_retries
        self.redacts = redact_remote and embedder.remote
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self._sleep: Callable[[float], Awaitable[None]] = sleep or asyncio.sleep

    @classmethod
    def from_config(cls, embedder: Embedder, config: MemoryConfig) -> EmbeddingPipeline:
        return cls(
            embedder,
            max_batch_chars=config.embeddings_max_batch_chars,
            max_retries=config.embeddings_max_retries,
            redact_remote=config.redact_before_embedding,
        )

    def text_to_send(self, text: str) -> str:
        """The exact text the embedder will see (its sha256 is the cache key)."""
        return redact(text) if self.redacts else text

    def batches(self, texts: Sequence[str]) -> list[list[str]]:
        out: list[list[str]] = []
        current: list[str] = []
        size = 0
        for text in texts:
            if current and (len(current) >= self.embedder.batch_size
                            or size + len(text) > self.max_batch_chars):
                out.append(current)
                current, size = [], 0
            current.append(text)
            size += len(text)
        if current:
            out.append(current)
        return out

    async def embed_batch(self, texts: list[str], kind: EmbedKind = "passage") -> list[list[float]]:
        """One batch (already cut by :meth:`batches`, already redacted), with retries."""
        attempt = 0
        while True:
            try:
                vectors = await self.embedder.embed(texts, kind)
            except EmbedderError as exc:
                if not exc.retryable or attempt >= self.max_retries:
                    raise
                delay = random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))
                log.info("memory.embed.retry", attempt=attempt + 1, delay_s=round(delay, 3),
                         status=exc.status, error=str(exc))
                attempt += 1
                await self._sleep(delay)
                continue
            if len(vectors) != len(texts):
                raise EmbedderError(f"embedder returned {len(vectors)} vectors for "
                                    f"{len(texts)} texts",
                                    retryable=False)
            return vectors

    async def embed_query(self, text: str) -> list[float]:
        return (await self.embed_batch([self.text_to_send(text)], "query"))[0]


class RecentQueries:
    """The vectors of the last ``size`` distinct queries a pipeline embedded: a run's recall,
    its facts and its episodes embed the same message, and a local model spends tens of
    milliseconds per query (bench/facts.py)."""

    def __init__(self, pipeline: EmbeddingPipeline, size: int = 16) -> None:
        self.pipeline = pipeline
        self.size = size
        self._vectors: OrderedDict[str, list[float]] = OrderedDict()

    async def embed(self, text: str) -> list[float]:
        cached = self._vectors.get(text)
        if cached is not None:
            self._vectors.move_to_end(text)
            return cached
        vector = await self.pipeline.embed_query(text)
        self._vectors[text] = vector
        while len(self._vectors) > self.size:
            self._vectors.popitem(last=False)
        return vector


# --- OpenAI-compatible ----------------------------------------------------------------------


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint through ``AsyncOpenAI``.

    The SDK's own retries are off (``max_retries=0``): :class:`EmbeddingPipeline` retries,
    so retry policy lives in one place. Errors become :class:`EmbedderError` with
    ``retryable`` set for 408/409/429/5xx, timeouts and connection failures.
    """

    provider = "openai"
    remote = True

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        model: str = "text-embedding-3-small",
        dimensions: int | None = None,
        batch_size: int = 64,
        timeout_s: float = 30.0,
    ) -> None:
        import openai

        self._openai = openai
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "unused", base_url=base_url, timeout=timeout_s, max_retries=0
        )
        self._model = model
        self._dimensions = dimensions
        # The dimension count is part of the identity: text-embedding-3 vectors cut to 256
        # are not comparable with full-width ones.
        self.model_id = model if dimensions is None else f"{model}@{dimensions}"
        self.dims = dimensions or 0
        self.max_tokens: int | None = None  # long (8k for text-embedding-3); chunking keeps its cap
        self.batch_size = batch_size
        self.endpoint_hash = endpoint_hash(str(self._client.base_url))

    async def embed(self, texts: list[str], kind: EmbedKind = "passage") -> list[list[float]]:
        # OpenAI's embedding models take no query/passage prefix: ``kind`` changes nothing.
        openai = self._openai
        kwargs: dict[str, object] = {"model": self._model, "input": texts,
                                     "encoding_format": "float"}
        if self._dimensions is not None:
            kwargs["dimensions"] = self._dimensions
        try:
            response = await self._client.embeddings.create(**kwargs)  # type: ignore[arg-type]
        except openai.APIStatusError as exc:
            status = exc.status_code
            retryable = status in (408, 409, 429) or status >= 500
            raise EmbedderError(f"embeddings endpoint answered {status}", retryable=retryable,
                                status=status) from exc
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise EmbedderError(f"embeddings endpoint unreachable: {type(exc).__name__}",
                                retryable=True) from exc
        except (openai.APIResponseValidationError, ValueError) as exc:
            # Not the JSON the API sends (a proxy's error page, a body cut short): the SDK
            # raises json's ValueError, which must not escape as an internal error.
            raise EmbedderError(f"embeddings endpoint sent a malformed reply: {type(exc).__name__}",
                                retryable=True) from exc
        try:
            data = sorted(response.data, key=lambda d: d.index)
            vectors = [list(map(float, d.embedding)) for d in data]
        except (AttributeError, TypeError, ValueError) as exc:
            raise EmbedderError(f"embeddings endpoint sent a malformed reply: {type(exc).__name__}",
                                retryable=True) from exc
        if vectors:
            width = len(vectors[0])
            if self.dims and width != self.dims:
                raise EmbedderError(f"expected {self.dims} dims, got {width}", retryable=False)
            self.dims = width
        return vectors

    async def aclose(self) -> None:
        await self._client.close()


# --- selection ------------------------------------------------------------------------------


def _local_importable(config: MemoryConfig) -> str | None:
    """None when the configured local model can run, else why not (nothing is loaded)."""
    from memory.embedders.local_embedder import unavailable_reason

    return unavailable_reason(config.local_model)


def _local_embedder(config: MemoryConfig) -> Embedder:
    from memory.embedders.local_embedder import LocalEmbedder

    return LocalEmbedder(
        config.local_model,
        batch_size=config.local_batch_size,
        max_tokens=config.local_max_tokens,
        threads=config.local_threads,
    )


# What the probe embeds: one short query, so a working endpoint costs next to nothing.
PROBE_TEXT = "recalld embeddings probe"
# The probe delays start-up, so it waits at most this long (or embeddings_timeout_s if shorter).
PROBE_TIMEOUT_S = 10.0


async def probe_auto_embedder(config: MemoryConfig, embedder: Embedder | None,
                              reason: str) -> tuple[Embedder | None, str]:
    """For ``embedder = "auto"`` that picked the OpenAI-compatible endpoint: embed one short
    text there, once, and fall back to the local model (or to keyword search) if it fails.

    An API key set for a chat server that has no ``/embeddings`` (Ollama without an embedding
    model, llama.cpp without ``--embeddings``) would otherwise leave memory keyword-only with
    nothing said. Any failure counts, a timeout (:data:`PROBE_TIMEOUT_S`) too: the
    reason, logged once as the warning ``memory.embedder.fallback``, says which. An embedder
    chosen explicitly (``openai``) is never second-guessed.
    """
    if config.embedder != "auto" or not isinstance(embedder, OpenAIEmbedder):
        return embedder, reason
    limit = min(PROBE_TIMEOUT_S, config.embeddings_timeout_s)
    try:
        async with asyncio.timeout(limit):
            await embedder.embed([PROBE_TEXT], kind="query")
    except (EmbedderError, TimeoutError) as exc:
        failure = str(exc) or f"no answer within {limit:g} s"
    else:
        return embedder, f"{reason}; the embeddings endpoint answered a probe"
    await embedder.aclose()
    endpoint = config.embeddings_base_url or "https://api.openai.com/v1"
    missing = _local_importable(config)
    fallback: Embedder | None = None
    if missing is None:
        fallback = _local_embedder(config)
        why = (f"auto: the embeddings endpoint {endpoint} failed a probe ({failure}); "
               "using the local embedder")
    else:
        why = (f"auto: the embeddings endpoint {endpoint} failed a probe ({failure}) and "
               f"{missing}: keyword search only")
    log.warning("memory.embedder.fallback", endpoint=endpoint, error=failure,
                using=fallback.provider if fallback else "none", reason=why,
                fix="set memory.embedder (\"local\" or \"openai\") or an embeddings model the "
                    "endpoint serves")
    return fallback, why


def select_embedder(config: MemoryConfig) -> tuple[Embedder | None, str]:
    """Pick the embedder ``config.embedder`` asks for; returns it (or None) and why."""
    choice = config.embedder
    if not config.enabled or choice == "none":
        return None, ("embedder 'none' configured: keyword search only" if config.enabled
                      else "memory disabled")

    def openai_embedder() -> Embedder:
        return OpenAIEmbedder(
            api_key=config.embeddings_api_key,
            base_url=config.embeddings_base_url,
            model=config.embeddings_model,
            dimensions=config.embeddings_dimensions,
            batch_size=config.embeddings_batch_size,
            timeout_s=config.embeddings_timeout_s,
        )

    def local_embedder() -> Embedder:
        return _local_embedder(config)

    if choice == "openai":
        return openai_embedder(), "embedder 'openai' configured"
    if choice == "local":
        missing = _local_importable(config)
        if missing:
            return None, missing
        return local_embedder(), "embedder 'local' configured"
    # auto
    if config.embeddings_api_key:
        return openai_embedder(), "auto: an embeddings API key is configured"
    missing = _local_importable(config)
    if missing is None:
        return local_embedder(), "auto: no API key; local embedder installed"
    return None, f"auto: no API key and {missing}: keyword search only"


def previous_embedder(config: MemoryConfig, provider: str, model_id: str,
                      endpoint: str) -> tuple[Embedder | None, str]:
    """An embedder for the queries of a previous identity ``(provider, model_id, endpoint)``
    whose cached vectors serve the vector leg while a rebuild runs, or None and why not.

    Only what can be rebuilt from the configuration without guessing: a ``local`` model of
    :data:`memory.embedders.local_embedder.MODELS` that is installed (its window cut as the
    ``model_id`` says), or a model of the configured OpenAI-compatible endpoint (same endpoint
    hash: only the model or its dimensions changed). Building it loads nothing and calls
    nothing; the first query does.
    """
    if provider == "local":
        from memory.embedders.local_embedder import MODELS, LocalEmbedder

        name, _, window = model_id.partition("@")
        spec = next((s for s in MODELS.values() if s.model_id == name), None)
        if spec is None:
            return None, f"the previous local model {model_id!r} is not one this version knows"
        missing = _local_importable(replace(config, local_model=spec.name))
        if missing is not None:
            return None, missing
        if window and not window.isdigit():
            return None, f"the previous local model id {model_id!r} is not one this version writes"
        local = LocalEmbedder(spec, batch_size=1, max_tokens=int(window) if window else None,
                              threads=config.local_threads)
        if local.model_id != model_id:
            return None, f"the previous local model {model_id!r} cannot be rebuilt exactly"
        return local, f"previous local model {model_id}"
    if provider == "openai":
        if not config.embeddings_api_key and not config.embeddings_base_url:
            return None, "no OpenAI-compatible endpoint is configured for the previous model"
        name, _, width = model_id.rpartition("@") if "@" in model_id else (model_id, "", "")
        if width and not width.isdigit():
            name, width = model_id, ""
        remote = OpenAIEmbedder(api_key=config.embeddings_api_key,
                                base_url=config.embeddings_base_url, model=name,
                                dimensions=int(width) if width else None, batch_size=1,
                                timeout_s=config.embeddings_timeout_s)
        if remote.endpoint_hash != endpoint or remote.model_id != model_id:
            # Another endpoint: its URL (and key) are no longer configured.
            return None, "the previous model's endpoint is not the configured one"
        return remote, f"previous model {model_id} of the configured endpoint"
    return None, f"an embedder of provider {provider!r} cannot be rebuilt from the configuration"
