"""Shared fixtures for the sessions tests: a real store on each backend.

``store`` and ``make_store`` run every test that uses them twice: on the file store (real
files under ``tmp_path``) and on :class:`sessions.pg.PgSessionStore` (a fresh database on the
real PostgreSQL of ``tests/pgfixtures.py``; skipped only when that server is unavailable).
Tests about the files themselves (line format, modes, fsync, torn tails, recovery, the index
cache) are marked ``jsonl_only`` and run on the file store alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson
import pytest
import structlog
from structlog.testing import capture_logs

import sessions.fileio
import sessions.index
import sessions.reconcile
import sessions.recovery
import sessions.rows
import sessions.shutdown
import sessions.store
import sessions.transcript
from sessions import SessionsConfig, SessionStore

if TYPE_CHECKING:
    from sessions.pg import PgSessionStore

# What structlog.testing.capture_logs collects: one mapping per event.
LogList = list[MutableMapping[str, Any]]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


BACKENDS = ("sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "jsonl_only: about transcript files, so run on the SQLite/JSONL store alone"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only_files = metafunc.definition.get_closest_marker("jsonl_only") is not None
        metafunc.parametrize("backend", BACKENDS[:1] if only_files else BACKENDS, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Which store the test runs on: ``sqlite`` (files) or ``postgres``."""
    return str(request.param)


@pytest.fixture
def make_store(
    backend: str, data_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., SessionStore]]:
    """``make_store(config)``: a store on this test's backend; every call opens the same data
    (one data dir, or one database), and each store made is closed at the end."""
    made: list[Any] = []
    # Asked for here, not in make(), so the database outlives the stores closed below; only
    # for postgres, so the file-store half of a run never starts the server.
    dsn = str(request.getfixturevalue("pg_dsn")) if backend == "postgres" else ""

    def make(config: SessionsConfig = SessionsConfig()) -> SessionStore:  # noqa: B008
        if backend == "sqlite":
            made.append(SessionStore(data_dir, config))
        else:
            from sessions.pg import PgSessionStore

            made.append(PgSessionStore(dsn, config, pool_size=4))
        # Both implement SessionStore's public API (the Protocol of issue 20 will name it).
        return cast(SessionStore, made[-1])

    yield make
    for s in made:
        s.close()


@pytest.fixture
def store(make_store: Callable[..., SessionStore]) -> SessionStore:
    return make_store(SessionsConfig())


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[LogList]:
    """Captured structlog events from the sessions modules.

    Fresh logger proxies are swapped in so capture works even when another test configured
    structlog with ``cache_logger_on_first_use``.
    """
    with capture_logs() as captured:
        for module in (
            sessions.fileio,
            sessions.index,
            sessions.reconcile,
            sessions.recovery,
            sessions.rows,
            sessions.shutdown,
            sessions.store,
            sessions.transcript,
        ):
            monkeypatch.setattr(module, "log", structlog.get_logger(module.__name__))
        yield captured


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a transcript, parsed (fails the test if any line is not JSON)."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def fill(s: SessionStore | PgSessionStore, user: str, key: str, n: int,
         prefix: str = "m") -> list[str]:
    """Append ``n`` alternating user/assistant messages; returns their contents."""
    contents = [f"{prefix}{i}" for i in range(n)]
    for i, text in enumerate(contents):
        s.append_message(user, key, role="user" if i % 2 == 0 else "assistant", content=text)
    return contents
