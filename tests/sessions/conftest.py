"""Shared fixtures for the sessions tests: a real store on real files under ``tmp_path``."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

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

# What structlog.testing.capture_logs collects: one mapping per event.
LogList = list[MutableMapping[str, Any]]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir: Path) -> Iterator[SessionStore]:
    s = SessionStore(data_dir, SessionsConfig())
    yield s
    s.close()


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


def fill(s: SessionStore, user: str, key: str, n: int, prefix: str = "m") -> list[str]:
    """Append ``n`` alternating user/assistant messages; returns their contents."""
    contents = [f"{prefix}{i}" for i in range(n)]
    for i, text in enumerate(contents):
        s.append_message(user, key, role="user" if i % 2 == 0 else "assistant", content=text)
    return contents
