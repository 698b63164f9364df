"""Shared helpers for memory tests: a counting fake embedder and transcript writers."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from memory.config import MemoryConfig
from memory.errors import EmbedderError
from memory.service import MemoryService

_WORDS = re.compile(r"\w", re.UNICODE)
_TOKENS = re.compile(r"[a-z0-9]+|[^\W\d_a-z]", re.UNICODE)
BASE_TIME = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)


def fake_vector(text: str, dims: int) -> list[float]:
    """Feature-hashed bag of lower-cased words (CJK per character), unit length."""
    vec = [0.0] * dims
    for word in _TOKENS.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vec[h % dims] += 1.0 if (h >> 63) & 1 else -1.0
    if not any(vec):
        vec[0] = 1.0
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec]


class FakeEmbedder:
    """Deterministic embedder that records every call; ``fail`` makes calls raise."""

    provider = "fake"
    endpoint_hash = "none"
    remote = False

    def __init__(self, dims: int = 64, model_id: str = "fake-bow", batch_size: int = 8) -> None:
        self.dims = dims
        self.model_id = model_id
        self.batch_size = batch_size
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None
        self.vectors: dict[str, list[float]] = {}  # overrides by exact text

    @property
    def texts(self) -> list[str]:
        return [t for call in self.calls for t in call]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail is not None:
            raise self.fail
        return [self.vectors.get(t) or fake_vector(t, self.dims) for t in texts]


def embedder_down() -> EmbedderError:
    return EmbedderError("embeddings endpoint answered 503", retryable=False, status=503)


def ts(minutes: float) -> str:
    """An ISO-8601 UTC timestamp ``minutes`` after BASE_TIME, as the sessions package writes."""
    moment = BASE_TIME + timedelta(minutes=minutes)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def message_line(content: str, *, role: str = "user", minute: float = 0, name: str | None = None,
                 msg_id: str = "m") -> bytes:
    obj: dict[str, Any] = {"type": "message", "id": msg_id, "role": role, "content": content,
                           "ts": ts(minute), "runId": "r1"}
    if name is not None:
        obj["name"] = name
    return orjson.dumps(obj) + b"\n"


def transcript_path(data_dir: Path, user: str, key: str) -> Path:
    return data_dir / "sessions" / user / f"{key}.jsonl"


def write_transcript(data_dir: Path, user: str, key: str, messages: Iterable[str | tuple[str, str]],
                     *, start_minute: float = 0) -> Path:
    """A header plus one message per item (``"text"`` alternates user/assistant, or ``(role, text)``)."""
    path = transcript_path(data_dir, user, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"type": "session", "version": 1, "sessionKey": key, "user": user,
              "createdAt": ts(start_minute), "title": key}
    with path.open("wb") as fh:
        fh.write(orjson.dumps(header) + b"\n")
    append_messages(path, messages, start_minute=start_minute)
    return path


def append_messages(path: Path, messages: Iterable[str | tuple[str, str]], *, start_minute: float = 0) -> None:
    with path.open("ab") as fh:
        for i, item in enumerate(messages):
            role, text = item if isinstance(item, tuple) else (("user", "assistant")[i % 2], item)
            fh.write(message_line(text, role=role, minute=start_minute + i, msg_id=f"m{start_minute + i}"))


def quiet_config(**overrides: Any) -> MemoryConfig:
    """Defaults for tests: no watcher, short debounce, no retry sleeps."""
    values: dict[str, Any] = {"watch": False, "debounce_ms": 50, "embeddings_max_retries": 0}
    values.update(overrides)
    return MemoryConfig(**values)


@asynccontextmanager
async def opened(data_dir: Path, config: MemoryConfig, embedder: Any, **kwargs: Any) -> AsyncIterator[MemoryService]:
    """A started service whose start-up catch-up sync has finished."""
    svc = MemoryService(data_dir, config, embedder, **kwargs)
    await svc.start()
    try:
        await svc.wait_idle()
        yield svc
    finally:
        await svc.close()


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder()


@pytest.fixture
async def service(tmp_path: Path, embedder: FakeEmbedder) -> AsyncIterator[MemoryService]:
    svc = MemoryService(tmp_path, quiet_config(), embedder)
    await svc.start()
    await svc.wait_idle()  # the start-up catch-up sync has run
    try:
        yield svc
    finally:
        await svc.close()
