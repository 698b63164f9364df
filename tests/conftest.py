"""Shared fixtures: a real gateway on port 0 with a real data dir, and real clients."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from testkit.gateway import TOKEN, make_config
from testkit.gateway import running_gateway as running
from tests.fake_openai import FakeOpenAI, fake_openai

pytest_plugins = ["tests.pgfixtures"]  # postgres_server, pg_dsn

# fake_openai: a fixture for every module
__all__ = ["TOKEN", "fake_openai", "make_config", "running"]

# Property tests check behaviour, never speed: Hypothesis's per-example deadline (200 ms) and
# its too-slow health check fail a correct test on a loaded machine, as a CI run once did.
settings.register_profile("recalld", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("recalld")


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """A test that runs a CLI command in-process (``configure_logging``) leaves no root handler
    behind: bound to that test's captured stderr, it would write to a closed file later."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if getattr(handler, "_recalld", False) and handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture
def config_factory(tmp_path: Path) -> Callable[..., Config]:
    def factory(**sections: dict[str, Any]) -> Config:
        return make_config(tmp_path / "data", **sections)

    return factory


@pytest.fixture(params=["sqlite", "postgres"])
def backend_config_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Config]:
    """``config_factory`` on each storage backend: SQLite + JSONL in the data dir, and PostgreSQL
    on a fresh database (skipped, with the reason, when ``postgres_server`` is)."""
    storage: dict[str, Any] = {}
    if request.param == "postgres":
        storage = {"backend": "postgres", "dsn": request.getfixturevalue("pg_dsn")}

    def factory(**sections: dict[str, Any]) -> Config:
        return make_config(tmp_path / "data", storage=storage, **sections)

    return factory


@pytest.fixture
async def app(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    async with running(config_factory()) as app:
        yield app


@pytest.fixture
async def client(app: App) -> AsyncIterator[Client]:
    async with Client.connect(app.url, TOKEN) as c:
        yield c


@pytest.fixture
async def chat_app(config_factory: Callable[..., Config],
                   fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """A gateway whose model endpoint is the loopback fake server."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                              "model": "fake-model", "timeout_s": 5.0, "max_retries": 0})
    async with running(cfg) as app:
        yield app
