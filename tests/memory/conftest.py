"""Shared helpers for memory tests: a counting fake embedder and transcript writers.

Transcripts are written by the real ``SessionStore``, so the index is always tested against
the lines the store produces. Tests name sessions (``"s1"``); :func:`session_key` turns a name
into the well-formed key the store is given, and :func:`name_of` turns it back.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from memory.config import MemoryConfig
from memory.errors import EmbedderError, MemoryStorageError
from memory.pg.service import PgMemory
from memory.sqlite.service import MemoryService
from sessions import (
    REPLACES_KEY,
    Message,
    PgSessionStore,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    format_ts,
    parse_transcript_relpath,
    sessions_root,
    transcript_file,
)

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
    max_tokens: int | None = None
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

    async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail is not None:
            raise self.fail
        return [self.vectors.get(t) or fake_vector(t, self.dims) for t in texts]


def embedder_down() -> EmbedderError:
    return EmbedderError("embeddings endpoint answered 503", retryable=False, status=503)


def ts(minutes: float) -> str:
    """An ISO-8601 UTC timestamp ``minutes`` after BASE_TIME, as the sessions package writes."""
    return format_ts(BASE_TIME + timedelta(minutes=minutes))


def session_key(name: str) -> str:
    """The session key a test calls ``name`` (a well-formed key: 32 hex digits, stable)."""
    key = hashlib.md5(name.encode()).hexdigest()
    _NAMES[key] = name
    return key


def name_of(key: str) -> str:
    """The test's name for a key made by :func:`session_key`."""
    return _NAMES[key]


_NAMES: dict[str, str] = {}


def message_line(content: str, *, role: str = "user", minute: float = 0) -> bytes:
    """One message line exactly as ``SessionStore.append_message`` would write it, for tests that
    write it in pieces (a torn append)."""
    message = Message(id=uuid.uuid4().hex, role=role, content=content, ts=ts(minute), run_id=None)
    return orjson.dumps(message.to_line()) + b"\n"


def transcript_path(data_dir: Path, user: str, name: str) -> Path:
    return transcript_file(sessions_root(data_dir), user, session_key(name))


def _store(data_dir: Path, key: str) -> SessionStore:
    return SessionStore(data_dir, SessionsConfig(fsync="never"), key_factory=lambda: key)


def write_transcript(data_dir: Path, user: str, name: str,
                     messages: Iterable[str | tuple[str, str]],
                     *, start_minute: float = 0, memory: bool = True) -> Path:
    """A new transcript, written by the real ``SessionStore``, replacing any earlier one of that
    name: a header plus one message per item (``"text"`` alternates user/assistant, or
    ``(role, text)``), dated a minute apart from ``start_minute`` (``memory=False``: incognito)."""
    key = session_key(name)
    with _store(data_dir, key) as store:
        with contextlib.suppress(SessionNotFound):
            store.delete(user, key)
        store.create(user, title=name, created_at=ts(start_minute), memory=memory)
        _append(store, user, key, messages, start_minute)
        return store.transcript_path(user, key)


def append_messages(path: Path, messages: Iterable[str | tuple[str, str]], *,
                    start_minute: float = 0) -> None:
    """Append to the transcript at ``path`` through ``SessionStore.append_message``."""
    owner = parse_transcript_relpath(f"{path.parent.name}/{path.name}")
    assert owner is not None, path
    user, key = owner
    with _store(path.parent.parent.parent, key) as store:
        _append(store, user, key, messages, start_minute)


def _append(store: SessionStore | PgSessionStore, user: str, key: str,
            messages: Iterable[str | tuple[str, str]], start_minute: float) -> list[Message]:
    written = []
    for i, item in enumerate(messages):
        role, text = item if isinstance(item, tuple) else (("user", "assistant")[i % 2], item)
        written.append(store.append_message(user, key, role=role, content=text,
                                            ts=ts(start_minute + i)))
    return written


def quiet_config(**overrides: Any) -> MemoryConfig:
    """Defaults for tests: no watcher, short debounce, no retry sleeps."""
    values: dict[str, Any] = {"watch": False, "debounce_ms": 50, "embeddings_max_retries": 0}
    values.update(overrides)
    return MemoryConfig(**values)


@asynccontextmanager
async def opened(data_dir: Path, config: MemoryConfig, embedder: Any,
                 **kwargs: Any) -> AsyncIterator[MemoryService]:
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


# --- one suite, both backends ------------------------------------------------------------
#
# ``memory_backend`` runs every test that uses it (directly or through ``memory_service``)
# twice: on SQLite (``MemoryService`` over the JSONL transcripts in ``tmp_path``) and on
# PostgreSQL (``PgMemory`` over the sessions tables of a fresh database, written by the real
# ``PgSessionStore``; skipped with the reason when ``postgres_server`` is). Tests about the
# SQLite file itself are marked ``sqlite_only`` and run there alone.

MEMORY_BACKENDS = ("sqlite", "postgres")

# Both implement the ``memory.Memory`` Protocol; the union lets a test reach what both have
# beyond it (``facts.get``, ``facts.relevant``), checked by mypy on each.
BackendMemory = MemoryService | PgMemory


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "memory_backend" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("sqlite_only") is not None:
            metafunc.parametrize("memory_backend", ["sqlite"], indirect=True)
            return
        params: list[Any] = list(MEMORY_BACKENDS)
        differs = metafunc.definition.get_closest_marker("postgres_differs")
        if differs is not None:
            reason = differs.kwargs.get("reason") or differs.args[0]
            params[1] = pytest.param("postgres",
                                     marks=pytest.mark.xfail(strict=True, reason=reason))
        metafunc.parametrize("memory_backend", params, indirect=True)


class MemoryBackend:
    """One test's storage on one backend: transcripts written through that backend's real
    sessions store, and started memory services over them (every one over the same data)."""

    def __init__(self, name: str, data_dir: Path, dsn: str = "",
                 new_database: Callable[[], tuple[str, Callable[[], None]]] | None = None) -> None:
        self.name = name
        self.data_dir = data_dir
        self.dsn = dsn
        self._new_database = new_database
        self._others: list[MemoryBackend] = []
        self._drops: list[Callable[[], None]] = []
        self._key = ""
        self._pg: Any = None
        if name == "postgres":
            # Made now, so the sessions tables exist before a memory service opens.
            self._pg = PgSessionStore(dsn, SessionsConfig(), pool_size=1,
                                      key_factory=lambda: self._key)

    @property
    def is_postgres(self) -> bool:
        return self.name == "postgres"

    def close(self) -> None:
        for other in self._others:
            other.close()
        if self._pg is not None:
            self._pg.close()
        for drop in self._drops:
            drop()

    def another(self) -> MemoryBackend:
        """A second, empty storage of the same backend (a directory beside this one's files, or
        a fresh database), closed with this one: for comparing an index with one built anew."""
        if self._pg is None:
            other = MemoryBackend(self.name, self.data_dir / f"another-{len(self._others)}")
        else:
            assert self._new_database is not None, "made without a way to create a database"
            dsn, drop = self._new_database()
            other = MemoryBackend(self.name, self.data_dir, dsn, self._new_database)
            other._drops.append(drop)
        self._others.append(other)
        return other

    def sessions_store(self) -> SessionStore | PgSessionStore:
        """This backend's real sessions store, making its own (random) session keys."""
        if self._pg is None:
            return SessionStore(self.data_dir, SessionsConfig(fsync="never"))
        return PgSessionStore(self.dsn, SessionsConfig(), pool_size=1)

    def chunk_rows(self) -> list[tuple[str, int, int, int, str]]:
        """(session key, chunk_idx, line_start, line_end, content) of every chunk in the index,
        in the order of their sessions (SQLite: transcript paths; PostgreSQL: user, key)
        and indexes."""
        if self._pg is None:
            import apsw

            db = apsw.Connection(str(self.data_dir / "memory.db"))
            try:
                return [(str(k), int(i), int(a), int(b), str(c)) for k, i, a, b, c in db.execute(
                    "SELECT session_key, chunk_idx, line_start, line_end, content FROM chunks "
                    "ORDER BY path, chunk_idx")]
            finally:
                db.close()
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute("SELECT session_key, chunk_idx, line_start, line_end, content "
                                "FROM recalld_memory_chunks "
                                "ORDER BY user_id, session_key, chunk_idx").fetchall()
        return [(str(k), int(i), int(a), int(b), str(c)) for k, i, a, b, c in rows]

    def write(self, user: str, name: str, messages: Iterable[str | tuple[str, str]], *,
              start_minute: float = 0, memory: bool = True) -> None:
        """As :func:`write_transcript`, on this backend: a new session called ``name`` (replacing
        any earlier one) with these messages, a minute apart from ``start_minute``."""
        if self._pg is None:
            write_transcript(self.data_dir, user, name, messages, start_minute=start_minute,
                             memory=memory)
            return
        self._key = key = session_key(name)
        with contextlib.suppress(SessionNotFound):
            self._pg.delete(user, key)
        self._pg.create(user, title=name, created_at=ts(start_minute), memory=memory)
        _append(self._pg, user, key, messages, start_minute)

    def messages(self, user: str, name: str) -> list[Message]:
        """The messages of the session called ``name`` (its latest 200), oldest first, as its store
        keeps them."""
        with self._store_of(name) as store:
            page, _ = store.history(user, session_key(name), limit=200)
        return list(page)

    def supersede(self, user: str, name: str, replaces: str, content: str, *, role: str = "user",
                  minute: float = 0) -> Message:
        """Append a message that supersedes the message ``replaces`` and every one after it (an
        edit, or a regenerated reply: the line's ``replaces`` key), as chat does."""
        with self._store_of(name) as store:
            return store.append_message(user, session_key(name), role=role, content=content,
                                        ts=ts(minute), extra={REPLACES_KEY: replaces})

    def purge(self, user: str, name: str, *, after: datetime | None = None,
              before: datetime | None = None) -> int:
        """Remove the session's messages timed in ``[after, before)`` through its store (what
        ``memory.forget {purgeTranscript:true}`` does); how many went."""
        with self._store_of(name) as store:
            return store.purge_messages(user, session_key(name), after=after, before=before)

    @contextlib.contextmanager
    def _store_of(self, name: str) -> Iterator[SessionStore | PgSessionStore]:
        if self._pg is None:
            with _store(self.data_dir, session_key(name)) as store:
                yield store
        else:
            yield self._pg

    def append(self, user: str, name: str, messages: Iterable[str | tuple[str, str]], *,
               start_minute: float = 0) -> None:
        """As :func:`append_messages`, on this backend, to the session called ``name``."""
        if self._pg is None:
            append_messages(transcript_path(self.data_dir, user, name), messages,
                            start_minute=start_minute)
            return
        _append(self._pg, user, session_key(name), messages, start_minute)

    def delete(self, user: str, name: str) -> None:
        """Delete the session called ``name`` through the sessions store."""
        if self._pg is None:
            with _store(self.data_dir, session_key(name)) as store:
                store.delete(user, session_key(name))
            return
        self._pg.delete(user, session_key(name))

    async def unstarted(self, config: MemoryConfig, embedder: Any, **kwargs: Any) -> BackendMemory:
        """A service over this storage, made but not started (SQLite: constructed; PostgreSQL:
        opened, its pool connected, its indexing loop not running): the test starts and
        closes it."""
        if self._pg is None:
            return MemoryService(self.data_dir, config, embedder, **kwargs)
        return await PgMemory.open(self.dsn, config, embedder, data_dir=self.data_dir, **kwargs)

    @asynccontextmanager
    async def opened(self, config: MemoryConfig, embedder: Any,
                     **kwargs: Any) -> AsyncIterator[BackendMemory]:
        """A started service whose start-up catch-up sync has finished (as :func:`opened`)."""
        if self._pg is None:
            async with opened(self.data_dir, config, embedder, **kwargs) as svc:
                yield svc
            return
        node = await PgMemory.open(self.dsn, config, embedder, data_dir=self.data_dir, **kwargs)
        # The indexing loop is not started: as on SQLite (watch off) a test's syncs are its own
        # sync_now calls, and closing a node whose loop waits in LISTEN sometimes never returns
        # (the loop task stays "cancelling" in psycopg's notifies(); reported in issue 30).
        try:
            # The catch-up pass of the start, as the loop runs a pass (PgMemory._pass): an embedder
            # or storage failure leaves the chunks pending for the next pass (and in status's
            # lastError), as MemoryService's start-up sync does.
            with contextlib.suppress(EmbedderError, MemoryStorageError):
                await node.sync_now()
            yield node
        finally:
            await node.close()


@pytest.fixture
def memory_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryBackend]:
    """This test's storage: ``sqlite`` (files under ``tmp_path``) or ``postgres`` (a fresh
    database; only then is ``pg_dsn`` asked for, so the SQLite half never starts the server)."""
    name = str(request.param)
    if name != "postgres":
        backend = MemoryBackend(name, tmp_path)
    else:
        server = request.getfixturevalue("postgres_server")

        def new_database() -> tuple[str, Callable[[], None]]:
            db = f"m{uuid.uuid4().hex[:16]}"
            return server.create_database(db), lambda: server.drop_database(db)

        backend = MemoryBackend(name, tmp_path, str(request.getfixturevalue("pg_dsn")),
                                new_database)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
async def memory_service(memory_backend: MemoryBackend,
                         embedder: FakeEmbedder) -> AsyncIterator[BackendMemory]:
    """``service`` on each backend: started, its catch-up sync over."""
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        yield svc
