"""The embedder Protocol: what every embedder is, with nothing around it (the code around it is
``memory.embedders.embeddings``; the offline model is ``memory.embedders.local_embedder``)."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

__all__ = ["EmbedKind", "Embedder"]

EmbedKind = Literal["query", "passage"]


@runtime_checkable
class Embedder(Protocol):
    provider: str
    model_id: str
    dims: int
    batch_size: int
    endpoint_hash: str
    remote: bool

    max_tokens: int | None  # the model's input window in its own tokens; None when unknown

    async def embed(self, texts: list[str], kind: EmbedKind = "passage") -> list[list[float]]:
        """One vector per text. ``kind="query"`` for a search's query, ``"passage"`` for stored
        text: retrieval-tuned models are trained with a different prefix for each."""
        ...
